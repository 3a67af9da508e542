//! Every SQL text the backend sends, built once per schema.
//!
//! The schema name is a checked identifier and always double-quoted; every
//! user-supplied value (names, owners, candidates, keys) is a bind
//! parameter.

mod ddl;

use ddl::ddl;
pub(crate) use ddl::{SCHEMA_CURRENT, SCHEMA_OTHER};

/// The layout version written to `meta`; bump when the DDL changes.
pub(crate) const SCHEMA_VERSION: i32 = 23;

/// The prepared texts for one schema.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) check_version: String,
    pub(crate) ddl: String,
    pub(crate) claim_take: String,
    pub(crate) claim_acquire: String,
    pub(crate) claim_release: String,
    pub(crate) claim_leave: String,
    pub(crate) claim_extend: String,
    pub(crate) claim_force_release: String,
    pub(crate) claim_remaining: String,
    pub(crate) claim_inspect: String,
    pub(crate) leader: String,
    pub(crate) leader_inspect: String,
    pub(crate) fencing_next: String,
    pub(crate) barrier_arrive: String,
    pub(crate) barrier_is_complete: String,
    pub(crate) barrier_withdraw: String,
    pub(crate) limiter_check: String,
    pub(crate) limiter_gcra: String,
    pub(crate) semaphore_acquire: String,
    pub(crate) semaphore_durable: String,
    pub(crate) semaphore_release: String,
    pub(crate) semaphore_extend: String,
    pub(crate) semaphore_force_release: String,
    pub(crate) semaphore_inspect: String,
    pub(crate) queue_push: String,
    pub(crate) queue_pop: String,
    pub(crate) queue_pop_durable: String,
    pub(crate) queue_durable: String,
    pub(crate) queue_durable_wake: String,
    pub(crate) queue_ack: String,
    pub(crate) queue_nack: String,
    pub(crate) queue_abandon: String,
    pub(crate) queue_extend: String,
    pub(crate) queue_peek: String,
    pub(crate) queue_redrive: String,
    pub(crate) queue_stats: String,
    pub(crate) queue_purge: String,
    pub(crate) sweep: String,
    pub(crate) list_claims: String,
    pub(crate) list_semaphores: String,
    pub(crate) list_queues: String,
}

impl Sql {
    pub(crate) fn new(schema: &str) -> Sql {
        let s = format!("\"{schema}\"");
        Sql {
            check_version: format!("SELECT version FROM {s}.meta WHERE id = 1"),
            ddl: ddl(&s, schema),
            // $1 kind, $2 name, $3 owner, $4 candidate, $5 ttl µs, $6 the
            // client's stamp of the attempt (refused as a late copy when
            // its owner left since), $7 the grant's metadata (NULL: none).
            // The common attempt, one call (src/sql/claims.sql): the
            // name's row taken in place when it is free or expired, else,
            // when the name has no row, inserted by `claim_insert` (which
            // draws the token once the row is in the index). Nothing is
            // written (no row lock, no transaction id) when the row is held
            // by another. When it returns NULL, `claim_acquire` decides.
            // Like the other functions, it refuses to run at another
            // isolation level than read committed, before it writes.
            claim_take: format!(
                "SELECT {s}.claim_take($1::text, $2::text, $3::bytea, $4::text, $5::int8, \
                 $7::bytea, $6::int8)"
            ),
            // $1 kind, $2 name, $3 owner, $4 candidate, $5 ttl µs,
            // $6 channel, $7 notify on a fresh grant, $8 this client has
            // waiters on the name, $9 metadata of a new grant (NULL: none),
            // $10 the client's stamp of the attempt. See src/sql/claims.sql.
            claim_acquire: format!(
                "SELECT granted, held_us, registered FROM {s}.claim_acquire($1::text, $2::text, \
                 $3::bytea, $4::text, $5::int8, $6::text, $7::bool, $8::bool, $9::bytea, $10::int8)"
            ),
            // $1 kind, $2 name, $3 owner, $4 channel, $5 notify always
            // (elections: observers learn of every resignation).
            // Compare-and-release, in place: the owner's row,
            // expired or not (an expired one reports false), is freed
            // (owner, candidate and metadata NULL; the token, expiry and
            // waiting mark stay, for the next grant and the sweep), and
            // NOTIFY is sent (at commit of this same statement) when $5 or
            // when a waiter marked the row. RETURNING reads the clock once
            // the row is updated, so under its lock: a release that waited
            // past the expiry reports NotHeld.
            claim_release: format!(
                "UPDATE {s}.claims c SET owner = NULL, candidate = NULL, metadata = NULL \
                  WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea \
                 RETURNING c.expires_at > clock_timestamp() AS held, \
                   CASE WHEN $5::bool OR c.waiting \
                        THEN pg_notify($4::text, $1::text || ':' || $2::text) END AS woke"
            ),
            // $1 kind, $2 name, $3 owner, $4 channel, $5 notify always,
            // $6 the client's stamp of the release, $7 how long the mark
            // holds, µs. The release of an owner one of whose attempts
            // went unanswered: as `claim_release`, and the owner is
            // marked as left (src/sql/claims.sql, "Late attempts").
            claim_leave: format!(
                "SELECT held, woke FROM {s}.claim_leave($1::text, $2::text, $3::bytea, $4::text, \
                 $5::bool, $6::int8, $7::int8)"
            ),
            // $1 kind, $2 name, $3 owner, $4 ttl µs, $5 the client's stamp
            // of the extend, $6 the mark's lifetime in µs or NULL.
            // Compare-and-expire, as a step of the owner. The row is
            // locked first (`l`), and the clock read only then (`n` reads
            // it once per locked row), so an extend that waited for the row
            // lock past the expiry resurrects nothing. Another owner's row
            // is not locked at all. Stamped before the owner's mark on the
            // row (`stale`), it is a late copy overtaken by a later step of
            // its owner and changes nothing. With $6 (a step of the owner
            // went unanswered) it marks the owner as left at $5 for $6 µs
            // (the marks `claim_leave` keeps; lapsed ones pruned), so that
            // step's late copy, stamped before, is refused rather than
            // setting the expiry back to its own TTL. No row: the owner has
            // no row; else (stale, extended, marked). A claim no longer
            // live is not marked here: the owner's release marks it.
            claim_extend: format!(
                "WITH l AS MATERIALIZED (SELECT c.left_owners, c.left_stamps, c.left_until \
                   FROM {s}.claims c \
                   WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea FOR UPDATE), \
                 n AS MATERIALIZED (SELECT clock_timestamp() AS t, \
                   coalesce(l.left_owners IS NOT NULL AND {s}.claim_is_left(l.left_owners, \
                     l.left_stamps, l.left_until, $3::bytea, $5::int8), false) AS stale FROM l), \
                 u AS (UPDATE {s}.claims c SET expires_at = n.t + $4::int8 * interval '1 microsecond', \
                   left_owners = CASE WHEN $6::int8 IS NULL THEN c.left_owners ELSE \
                     (SELECT coalesce(array_agg(x.o), '{{}}'::bytea[]) \
                       FROM unnest(c.left_owners, c.left_stamps, c.left_until) AS x(o, s, u) \
                       WHERE x.u > n.t AND x.o <> $3::bytea) || $3::bytea END, \
                   left_stamps = CASE WHEN $6::int8 IS NULL THEN c.left_stamps ELSE \
                     (SELECT coalesce(array_agg(x.s), '{{}}'::int8[]) \
                       FROM unnest(c.left_owners, c.left_stamps, c.left_until) AS x(o, s, u) \
                       WHERE x.u > n.t AND x.o <> $3::bytea) || $5::int8 END, \
                   left_until = CASE WHEN $6::int8 IS NULL THEN c.left_until ELSE \
                     (SELECT coalesce(array_agg(x.u), '{{}}'::timestamptz[]) \
                       FROM unnest(c.left_owners, c.left_stamps, c.left_until) AS x(o, s, u) \
                       WHERE x.u > n.t AND x.o <> $3::bytea) \
                     || (n.t + $6::int8 * interval '1 microsecond') END \
                 FROM n \
                  WHERE c.kind = $1::text AND c.name = $2::text AND c.owner = $3::bytea \
                    AND c.expires_at > n.t AND NOT n.stale \
                 RETURNING 1) \
                 SELECT n.stale, EXISTS (SELECT 1 FROM u), \
                   $6::int8 IS NOT NULL AND EXISTS (SELECT 1 FROM u) FROM n"
            ),
            // $1 kind, $2 name, $3 channel, $4 notify always. Frees the
            // live row of any owner in place, as release does; NOTIFY as
            // for release.
            claim_force_release: format!(
                "WITH l AS MATERIALIZED (SELECT 1 FROM {s}.claims c \
                   WHERE c.kind = $1::text AND c.name = $2::text AND c.owner IS NOT NULL FOR UPDATE), \
                 n AS MATERIALIZED (SELECT clock_timestamp() AS t FROM l), \
                 r AS ( \
                   UPDATE {s}.claims c SET owner = NULL, candidate = NULL, metadata = NULL FROM n \
                    WHERE c.kind = $1::text AND c.name = $2::text AND c.owner IS NOT NULL AND c.expires_at > n.t \
                   RETURNING c.waiting \
                 ) \
                 SELECT 1 FROM r LEFT JOIN LATERAL (SELECT pg_notify($3::text, $1::text || ':' || $2::text) \
                   WHERE $4::bool OR r.waiting) w ON true"
            ),
            // $1 kind, $2 name.
            claim_remaining: format!(
                "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t) \
                 SELECT (extract(epoch FROM (c.expires_at - n.t)) * 1000000)::int8 \
                   FROM {s}.claims c, n \
                  WHERE c.kind = $1::text AND c.name = $2::text AND c.owner IS NOT NULL AND c.expires_at > n.t"
            ),
            // $1 kind, $2 name. The live holder (no row, or one): owner,
            // fencing token, remaining µs, metadata. Read only.
            claim_inspect: format!(
                "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t) \
                 SELECT c.owner, c.fencing, (extract(epoch FROM (c.expires_at - n.t)) * 1000000)::int8, \
                        c.metadata \
                   FROM {s}.claims c, n \
                  WHERE c.kind = $1::text AND c.name = $2::text AND c.owner IS NOT NULL AND c.expires_at > n.t"
            ),
            // $1 name.
            leader: format!(
                "SELECT c.candidate, c.fencing FROM {s}.claims c \
                  WHERE c.kind = 'election' AND c.name = $1::text AND c.owner IS NOT NULL \
                    AND c.expires_at > clock_timestamp()"
            ),
            // $1 name. The live leader (no row, or one): candidate,
            // owner, term, remaining µs. Read only.
            leader_inspect: format!(
                "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t) \
                 SELECT c.candidate, c.owner, c.fencing, \
                        (extract(epoch FROM (c.expires_at - n.t)) * 1000000)::int8 \
                   FROM {s}.claims c, n \
                  WHERE c.kind = 'election' AND c.name = $1::text AND c.owner IS NOT NULL \
                    AND c.expires_at > n.t"
            ),
            // The draw writes WAL only when it logs the sequence ahead; most
            // draws are covered by an earlier record, maybe another
            // transaction's whose commit was asynchronous and not flushed
            // yet. A commit flushes only if its transaction wrote WAL and
            // took a transaction id: setval of the scratch sequence does
            // both (as after a queue step), so the WAL up to here, the
            // record covering the token included, is flushed before the
            // token is returned (synchronous_commit is raised to on).
            fencing_next: format!("SELECT {s}.fencing_next(), setval('{s}.queue_flush', 1)"),
            // $1 name, $2 parties, $3 participant, $4 channel.
            barrier_arrive: format!(
                "SELECT generation, complete, started_with FROM {s}.barrier_arrive($1::text, $2::int4, $3::text, $4::text, $5::text)"
            ),
            // $1 name, $2 generation.
            // A generation older than the row (`born`: the row was swept
            // and made again) is unknown, not complete.
            barrier_is_complete: format!(
                "SELECT b.generation > $2::int8, $2::int8 < b.born FROM {s}.barriers b WHERE b.name = $1::text"
            ),
            // $1 name, $2 generation, $3 participant.
            barrier_withdraw: format!(
                "SELECT {s}.barrier_withdraw($1::text, $2::int8, $3::text, $4::text)"
            ),
            // $1 name, $2 owner, $3 permits, $4 total, $5 ttl µs, $6 queue,
            // $7 wake by NOTIFY, $8 channel, $9 queue place TTL µs,
            // $10 longest hint µs, $11 hint µs of a polling waiter near the
            // head, $12 the client's stamp of the attempt, $13 metadata of
            // a new grant (NULL: none). See src/sql/semaphore.sql.
            semaphore_acquire: format!(
                "SELECT granted, held_us, in_use FROM {s}.semaphore_acquire($1::text, $2::bytea, \
                 $3::int4, $4::int4, $5::int8, $6::bool, $7::bool, $8::text, $9::int8, $10::int8, \
                 $11::int8, $12::int8, $13::bytea)"
            ),
            // $1 name, $2 owner. Run after `semaphore_acquire` in the same
            // round trip, in a transaction of its own that commits
            // durably: a no-op (HOT) update of the grant's row writes WAL,
            // so its commit flushes the WAL up to here, the grant's
            // asynchronous commit included. Refused: no row, no write.
            semaphore_durable: format!(
                "UPDATE {s}.semaphore_holders h SET fencing = h.fencing \
                  WHERE h.name = $1::text AND h.owner = $2::bytea RETURNING 1"
            ),
            // $1 name, $2 owner, $3 channel, $4 the client's stamp of the
            // release if one of the owner's attempts went unanswered (else
            // NULL), $5 how long the owner's left row lasts, µs.
            semaphore_release: format!(
                "SELECT {s}.semaphore_release($1::text, $2::bytea, $3::text, $4::int8, $5::int8)"
            ),
            // $1 name, $2 owner, $3 ttl µs, $4 the client's stamp of the
            // extend, $5 the mark's lifetime in µs or NULL. Compare-and-
            // expire, as `claim_extend`: the row is locked first, the clock
            // read only then, so an extend that waited past the expiry
            // resurrects nothing. It takes no semaphore lock (it moves no
            // permit). Stamped before the owner's live `semaphore_left` mark
            // (`stale`, read by `semaphore_is_left` once the row is locked,
            // so a mark its lock wait was for is seen), it is a late copy
            // overtaken by a later step of its owner and changes nothing. With $5 (a step of the owner went
            // unanswered) the owner is marked as left at $4 for $5 µs, as a
            // release leaves, so that step's late copy is refused rather
            // than taken for the holder retrying or extending. No row: the
            // owner holds nothing; else (stale, extended, marked).
            semaphore_extend: format!(
                "WITH l AS MATERIALIZED (SELECT 1 FROM {s}.semaphore_holders h \
                   WHERE h.name = $1::text AND h.owner = $2::bytea FOR UPDATE), \
                 n AS MATERIALIZED (SELECT clock_timestamp() AS t, \
                   {s}.semaphore_is_left($1::text, $2::bytea, $4::int8) AS stale FROM l), \
                 m AS (INSERT INTO {s}.semaphore_left AS x (name, owner, stamp, expires_at) \
                   SELECT $1::text, $2::bytea, $4::int8, n.t + $5::int8 * interval '1 microsecond' \
                     FROM n WHERE $5::int8 IS NOT NULL AND NOT n.stale \
                   ON CONFLICT (name, owner) DO UPDATE \
                   SET stamp = greatest(x.stamp, EXCLUDED.stamp), \
                       expires_at = greatest(x.expires_at, EXCLUDED.expires_at) \
                   RETURNING 1), \
                 u AS (UPDATE {s}.semaphore_holders h \
                   SET expires_at = n.t + $3::int8 * interval '1 microsecond' FROM n \
                  WHERE h.name = $1::text AND h.owner = $2::bytea AND h.expires_at > n.t \
                    AND NOT n.stale \
                 RETURNING 1) \
                 SELECT n.stale, EXISTS (SELECT 1 FROM u), EXISTS (SELECT 1 FROM m) FROM n"
            ),
            // $1 name, $2 channel.
            semaphore_force_release: format!(
                "SELECT {s}.semaphore_force_release($1::text, $2::text)"
            ),
            // $1 name. One row per live grant (owner, fencing token,
            // remaining µs, metadata, permits; all NULL when there is
            // none), each with the name's count of live queued waiters:
            // one snapshot, one clock reading, read only.
            semaphore_inspect: format!(
                "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t) \
                 SELECT h.owner, h.fencing, (extract(epoch FROM (h.expires_at - n.t)) * 1000000)::int8, \
                        h.metadata, h.permits, \
                        (SELECT count(*) FROM {s}.semaphore_queue q \
                          WHERE q.name = $1::text AND q.expires_at > n.t) \
                   FROM n LEFT JOIN {s}.semaphore_holders h ON h.name = $1::text AND h.expires_at > n.t \
                  ORDER BY h.fencing"
            ),
            // $1 queue, $2 payload, $3 delay µs, $4 group, $5 dedup id,
            // $6 dedup window µs. See src/sql/queue.sql; run with
            // `queue_durable_wake` after it in the same round trip.
            queue_push: format!(
                "SELECT o_id, o_duplicate FROM {s}.queue_push($1::text, $2::bytea, $3::int8, \
                 $4::text, $5::text, $6::int8)"
            ),
            // $1 queue, $2 lane, $3 owner, $4 visibility µs,
            // $5 max deliveries (NULL: never), $6 ordered groups, $7 the
            // most messages made ready, $8 moved to the dead lane, in one
            // step, $9 how long an empty pop marks the lane as waited on
            // (µs; 0: not waited on by this client).
            queue_pop: format!(
                "SELECT o_id, o_payload, o_grp, o_attempts, o_enqueued_ms, o_token, o_next_us, \
                 o_marked, o_dead FROM {s}.queue_pop($1::text, $2::int2, $3::bytea, $4::int8, $5::int8, \
                 $6::bool, $7::int4, $8::int4, $9::int8)"
            ),
            // $1 owner. Run after `queue_pop` in the same round trip, in a
            // transaction of its own that commits durably: setval writes
            // WAL and takes a transaction id, so its commit flushes the
            // WAL up to here, the delivery's asynchronous commit (and its
            // token) included. An empty pop (no message in flight to this
            // owner, a fresh random token): nothing, no write. The owner
            // alone, so the only index that fits is the one on owners.
            queue_pop_durable: format!(
                "SELECT setval('{s}.queue_flush', 1) FROM {s}.queue_messages m \
                  WHERE m.owner = $1::bytea"
            ),
            // The same, unconditional: after a purge (its steps commit
            // asynchronously), and after a delivery the statement above
            // did not find.
            queue_durable: format!("SELECT setval('{s}.queue_flush', 1)"),
            // The same, and then the wake-up of a step that may have made
            // a message deliverable: $1 queue, $2 lane, $3 channel, $4
            // payload, $5 only if the lane has a ready message. Sent only
            // while the lane's waiting mark is live (see the header of
            // src/sql/queue.sql); its look at the mark comes after the
            // step's commit. One statement, no function call: every push
            // and ack runs it.
            queue_durable_wake: format!(
                "SELECT setval('{s}.queue_flush', 1), \
                        (SELECT pg_notify($3::text, $4::text) FROM {s}.queue_waiting w \
                          WHERE w.queue = $1::text AND w.lane = $2::int2 \
                            AND w.until > clock_timestamp() \
                            AND (NOT $5::bool OR EXISTS ( \
                                 SELECT 1 FROM {s}.queue_messages m \
                                  WHERE m.queue = $1::text AND m.lane = $2::int2 \
                                    AND m.due_at IS NULL)))"
            ),
            // $1 queue, $2 lane, $3 id, $4 owner.
            queue_ack: format!("SELECT {s}.queue_ack($1::text, $2::int2, $3::int8, $4::bytea)"),
            // $1 queue, $2 lane, $3 id, $4 owner, $5 delay µs.
            queue_nack: format!(
                "SELECT {s}.queue_nack($1::text, $2::int2, $3::int8, $4::bytea, $5::int8)"
            ),
            // $1 queue, $2 lane, $3 id, $4 owner, $5 visibility µs.
            // Compare-and-expire under the message's row lock, durable
            // (see src/sql/queue.sql).
            // $1 queue, $2 lane, $3 owner, $4 how long it is remembered
            // (µs).
            queue_abandon: format!(
                "SELECT {s}.queue_abandon($1::text, $2::int2, $3::bytea, $4::int8)"
            ),
            queue_extend: format!(
                "SELECT {s}.queue_extend($1::text, $2::int2, $3::int8, $4::bytea, $5::int8, $6::int8)"
            ),
            // $1 queue, $2 lane, $3 limit.
            queue_peek: format!(
                "SELECT m.id, m.payload, m.grp, m.attempts, \
                        floor(extract(epoch FROM m.enqueued_at) * 1000)::int8 \
                   FROM {s}.queue_messages m WHERE m.queue = $1::text AND m.lane = $2::int2 \
                  ORDER BY m.id LIMIT $3::int8"
            ),
            // $1 queue, $2 limit.
            queue_redrive: format!("SELECT {s}.queue_redrive($1::text, $2::int4)"),
            // $1 queue. Ready counts lapsed deliveries and due delays.
            // Listing (`coord ls`): $1 kind, $2 prefix, $3 limit; live
            // grants only.
            list_claims: format!(
                "SELECT c.name FROM {s}.claims c \
                  WHERE c.kind = $1::text AND starts_with(c.name, $2::text) \
                    AND c.owner IS NOT NULL AND c.expires_at > clock_timestamp() \
                  ORDER BY c.name LIMIT $3::int8"
            ),
            // $1 prefix, $2 limit: names with a live grant or place.
            list_semaphores: format!(
                "SELECT x.name FROM (\
                   SELECT h.name FROM {s}.semaphore_holders h \
                    WHERE starts_with(h.name, $1::text) AND h.expires_at > clock_timestamp() \
                   UNION \
                   SELECT q.name FROM {s}.semaphore_queue q \
                    WHERE starts_with(q.name, $1::text) AND q.expires_at > clock_timestamp()) x \
                  ORDER BY x.name LIMIT $2::int8"
            ),
            // $1 prefix, $2 limit: the queues with messages, one index
            // probe per queue name (not one per message).
            list_queues: format!(
                "WITH RECURSIVE q(queue) AS (\
                   (SELECT m.queue FROM {s}.queue_messages m ORDER BY m.queue LIMIT 1) \
                   UNION ALL \
                   SELECT (SELECT m.queue FROM {s}.queue_messages m WHERE m.queue > q.queue \
                            ORDER BY m.queue LIMIT 1) \
                     FROM q WHERE q.queue IS NOT NULL) \
                 SELECT q.queue FROM q \
                  WHERE q.queue IS NOT NULL AND starts_with(q.queue, $1::text) \
                  ORDER BY q.queue LIMIT $2::int8"
            ),
            queue_stats: format!(
                "WITH n AS MATERIALIZED (SELECT clock_timestamp() AS t) \
                 SELECT count(*) FILTER (WHERE m.lane = 0 AND (m.due_at IS NULL OR m.due_at <= n.t)), \
                        count(*) FILTER (WHERE m.lane = 0 AND m.due_at > n.t AND m.owner IS NULL), \
                        count(*) FILTER (WHERE m.lane = 0 AND m.due_at > n.t AND m.owner IS NOT NULL), \
                        count(*) FILTER (WHERE m.lane = 1) \
                   FROM {s}.queue_messages m, n WHERE m.queue = $1::text"
            ),
            // $1 queue, $2 the most rows deleted per step.
            queue_purge: format!(
                "SELECT o_deleted, o_done FROM {s}.queue_purge($1::text, $2::int4)"
            ),
            // $1 grace µs, $2 abandon µs, $3 rows per table.
            sweep: format!("SELECT {s}.sweep($1::int8, $2::int8, $3::int4)"),
            // $1 algorithm, $2 key, $3 limit, $4 window µs, $5 cost.
            limiter_check: format!(
                "SELECT allowed, remaining, retry_after, reset_after FROM {s}.limiter_check($1::text, $2::text, $3::int8, $4::int8, $5::int8)"
            ),
            // $1 key, $2 limit, $3 window µs, $4 cost. GCRA in one
            // statement, prepared once per connection (`prepared` only:
            // planned on every call it costs more than the function). See
            // `limiter_gcra`.
            limiter_gcra: limiter_gcra(&s),
        }
    }
}

/// GCRA's common check, in one statement: a key whose state was last
/// written under the same quota and that the unlocked read (`y`) admits
/// is admitted by the upsert `u`, which locks the row, then decides again
/// on the locked row with the clock read after the lock (the conflict
/// filter), and writes the new theoretical arrival time from a clock read
/// once more (later still, so it admits too: admission only gets easier
/// as time passes), with that time in `window_start` for the reply. Every
/// other case is `limiter_check` (src/sql/limiter.sql), in the same
/// statement, after `u`: no state yet, another quota (its rescaling), a
/// denial on the unlocked read (it writes nothing: `u` is not attempted,
/// so nothing is locked), and the rare races where `u` locked the row and
/// found it no longer admits, or found the row deleted by the sweep after
/// the read (`u` then inserts a stateless row, `q_limit` NULL, no
/// decision; the function, whose statements see it, decides on it). The
/// arithmetic is the function's, exact (numeric): with the same quota,
/// tat' = max(tat, now x L) + cost x W, admitted iff
/// tat' - W x L <= now x L, that is tat + (cost - L) x W <= now x L and
/// cost <= L. Like the function, it refuses another isolation level than
/// read committed and commits without waiting for the WAL flush (`l`,
/// evaluated before anything is written).
fn limiter_gcra(s: &str) -> String {
    let now = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint";
    format!(
        "WITH l AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true) \
           WHERE CASE WHEN current_setting('transaction_isolation') = 'read committed' THEN true \
                      ELSE {s}.not_read_committed() END), \
         u AS ( \
           INSERT INTO {s}.limiter_state AS x (algorithm, key) \
           SELECT 'gcra', $1::text FROM l, {s}.limiter_state y \
            WHERE y.algorithm = 'gcra' AND y.key = $1::text \
              AND y.q_limit = $2::int8 AND y.q_window = $3::int8 AND $4::int8 <= $2::int8 \
              AND y.tat_x + ($4::int8 - $2::int8)::numeric * $3::int8 <= {now}::numeric * $2::int8 \
           ON CONFLICT (algorithm, key) DO UPDATE \
           SET (tat_x, window_start) = ( \
               SELECT greatest(x.tat_x, n.t::numeric * $2::int8) + $4::int8::numeric * $3::int8, n.t \
                 FROM (SELECT {now} AS t OFFSET 0) n) \
           WHERE x.q_limit = $2::int8 AND x.q_window = $3::int8 \
             AND x.tat_x + ($4::int8 - $2::int8)::numeric * $3::int8 <= {now}::numeric * $2::int8 \
           RETURNING x.q_limit, x.tat_x, x.window_start) \
         SELECT true AS allowed, \
                greatest(0, floor((u.window_start::numeric * $2::int8 + $3::int8::numeric * $2::int8 \
                                   - u.tat_x) / $3::int8)::int8) AS remaining, \
                0::int8 AS retry_after, \
                greatest(0, ceil((u.tat_x - u.window_start::numeric * $2::int8) / $2::int8)::int8) \
                  AS reset_after \
           FROM u WHERE u.q_limit IS NOT NULL \
         UNION ALL \
         SELECT c.allowed, c.remaining, c.retry_after, c.reset_after \
           FROM {s}.limiter_check('gcra', $1::text, $2::int8, $3::int8, $4::int8) c \
          WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.q_limit IS NOT NULL)"
    )
}
