//! # coord-postgres
//!
//! The PostgreSQL backend of coord: locks, leases, fencing tokens, leader
//! election, barriers, rate limiters, FIFO semaphores and work queues on
//! ordinary tables, with expiry
//! measured on the DATABASE clock (`clock_timestamp()`), fencing tokens
//! issued in the same statement as the grant, and waiters woken by
//! `LISTEN`/`NOTIFY`.
//!
//! ```no_run
//! # async fn demo() -> coord_core::Result<()> {
//! use std::time::Duration;
//!
//! let coord = coord_postgres::connect("postgres://app:secret@db.internal/app?sslmode=verify-full&sslrootcert=/etc/ssl/pg-ca.pem").await?;
//! let locks = coord.locks()?;
//! let guard = locks
//!     .acquire("order_process_42", Duration::from_secs(30), Duration::from_secs(5))
//!     .await?;
//! println!("fencing token {}", guard.fencing_token());
//! guard.release().await?;
//!
//! // Options beyond the URL:
//! let coord = coord_postgres::builder("postgres://app@pgbouncer.internal:6432/app")
//!     .schema("coord_billing")
//!     .call_timeout(Duration::from_secs(2))
//!     .pool_size(8)
//!     // LISTEN cannot work through PgBouncer in transaction mode:
//!     .listen_url("postgres://app@db.internal:5432/app")
//!     .connect()
//!     .await?;
//! # drop(coord); Ok(()) }
//! ```
//!
//! ## URLs
//!
//! `postgres://` or `postgresql://`, as libpq takes them: user, password,
//! host (or `?host=/run/postgresql` for a unix socket), port, database and
//! tokio-postgres options (`connect_timeout`, `application_name`, ...).
//! Handled by coord: `sslmode` (`disable`, `prefer` — the default —,
//! `require`, `verify-ca`, `verify-full`, with libpq's meaning),
//! `sslrootcert` (a PEM file of CA certificates), `coord_schema`,
//! `coord_listen=false` and `coord_pool_size` (see
//! [`PostgresBuilder::pool_size`]), `listen_url` (or `coord_listen_url`:
//! the LISTEN connection's own URL, percent-encoded, as
//! [`PostgresBuilder::listen_url`]: behind PgBouncer,
//! `postgres://app@pgbouncer:6432/app?listen_url=postgres%3A%2F%2Fapp%40db%3A5432%2Fapp`).
//! An option neither coord nor tokio-postgres knows, or a malformed
//! value, is an [`Error::Config`](coord_core::Error::Config) naming it.
//! The password (the listen URL's too) is kept in a
//! [`Secret`](coord_core::util::Secret) and never appears in `Debug`,
//! `Display`, errors or logs.
//!
//! Several hosts, as libpq takes them, for a primary and its standbys:
//! `postgres://app@db1:5432,db2:5432/app?target_session_attrs=read-write`
//! (or `?host=db1,db2&port=5432,5432`). Every connection coord opens (the
//! pool's, the LISTEN connection, the first-use DDL's) tries the hosts in
//! order and keeps the first whose session is writable; with several
//! hosts and no `target_session_attrs`, coord asks for `read-write`
//! (libpq's default, `any`, would stay on a standby listed first, where
//! every call fails); `read-only` is refused. See "Failover".
//!
//! ## Failover
//!
//! With every server of a primary and its streaming standbys in the URL,
//! clients follow a promotion by themselves (tested with the primary
//! killed and with it fenced read-only, a lock workload running:
//! `tests/it/suite_failover.rs`). Calls on connections to the dead
//! server fail with [`Error::Unavailable`](coord_core::Error::Unavailable)
//! (retryable), as do writes refused by a read-only server (SQLSTATE
//! 25006), whose connection is dropped; new connections find the new
//! primary, within about a call and a connect timeout of the promotion.
//! The LISTEN connection reconnects there (backoff up to 2 s; its check
//! also leaves a server that went read-only) and wakes every local waiter
//! once. Fencing tokens, terms, permits, deliveries, barrier generations
//! and queue message ids keep rising per name even when the standby
//! missed the newest WAL: timeline `T` issues them above `T * 2^48`, and a
//! promotion starts a new timeline (`fencing_next`, `src/sql/schema.sql`).
//! What the standby never received is lost (with asynchronous
//! replication: grants, extends and releases acknowledged just before the
//! failure), so promote no sooner than the longest TTL in use after the
//! old primary stopped, or promote only a synchronous standby; see
//! `docs/operating.md`. [`Capabilities`](coord_core::Capabilities) say
//! `deployment: "primary-standby"` and `exclusive_across_failover: false`
//! (coord cannot see how the standbys replicate). Clients of an older
//! coord-postgres (layout 9 and before) stay monotonic beside upgraded
//! ones but are not safe across a failover: upgrade every client first.
//!
//! ## Layout
//!
//! Everything lives in one schema (default `coord`; it plays the role of
//! other backends' key prefix), created on first use with `IF NOT EXISTS`
//! in one transaction that holds `pg_advisory_xact_lock`, so clients
//! starting together on an empty database never fail:
//!
//! | object | what |
//! |---|---|
//! | `claims (kind, name, owner, candidate, fencing, expires_at, waiting, metadata, left_owners, left_stamps, left_until)` and functions `claim_take`, `claim_acquire`, `claim_insert`, `claim_leave`, `claim_is_left` | locks, leases and leaderships (`kind` = `lock`, `lease`, `election`: the kind segment); a row per name in use, freed in place on release (owner NULL) and deleted by the sweep once its last grant ended more than the grace ago; `metadata`: the holder metadata of its grant, if any; `left_*`: short-lived marks of owners that left while one of their attempts was unanswered (NULL nearly always; see below) |
//! | sequence `fencing` and functions `fencing_next`, `timeline_next`, `timeline_move`, `fencing_floor` | every fencing token, election term and barrier generation, drawn by `fencing_next` (queue message ids and semaphore places, from their own sequences, by `timeline_next` too); WAL-logged, so tokens never repeat across restarts or crashes, and each timeline has its own range above the previous ones, so they never repeat across a failover either (see "Failover") |
//! | `barriers (name, parties, generation, members, passed, updated_at, born, withdrawn_ids)` and functions `barrier_arrive`, `barrier_withdraw` | barriers (generations drawn from the sequence) |
//! | `limiter_state (algorithm, key, ...)`, `limiter_log (key, at, cost)` and function `limiter_check` | rate limiters (sliding log: one row per admitted request) |
//! | `semaphore_holders (name, owner, permits, total, fencing, expires_at, metadata)`, `semaphore_queue (name, owner, permits, total, place, wake, expires_at)`, `semaphore_left (name, owner, stamp, expires_at)`, sequence `semaphore_places` and functions `semaphore_acquire`, `semaphore_release`, `semaphore_force_release` | semaphores: a row per live grant and per queued waiter, none per name; a short-lived mark per owner that left while one of its attempts was unanswered (see "Semaphores") |
//! | `queue_messages (queue, lane, id, grp, attempts, enqueued_at, due_at, owner, payload)`, `queue_groups (queue, lane, grp, turn, first_id, ready_id)`, `queue_lanes (queue, lane, clock, groups)`, `queue_dedup (queue, dedup_id, id, expires_at)`, sequences `queue_ids` and `queue_flush`, functions `queue_push`, `queue_pop`, `queue_ack`, `queue_nack`, `queue_extend`, `queue_redrive`, `queue_purge` (and their helpers) | work queues: a row per message, per group with messages in a lane, per lane with groups, per live dedup id (see "Work queues") |
//! | function `sweep` | deletes the state of idle names (see "Bounded state") |
//! | `meta (version)` | layout version |
//!
//! A name keeps its row from its first grant until the sweep deletes it
//! (layout 11): release frees it in place. A lock attempt on a name nobody
//! holds is ONE call of `claim_take` (layout 14): an `UPDATE` that takes
//! the free or expired row in place and draws the fencing token under the
//! row lock, or, when the name has no row, `claim_insert` (a free row
//! inserted, then taken in place, so every token is drawn once its row is
//! in the index).
//! Otherwise (the row is held, or this client already waits on the name)
//! one call of `claim_acquire`: a plain read of the row, then, only when
//! that row looked free, expired or already ours, the same take in place,
//! re-checked on the newest version under the row lock. When the row is
//! held by another, the attempt returns the holder's remaining time on
//! the database clock and takes no row lock, no transaction id and writes
//! nothing, so polling waiters never queue behind (or in front of) the holder's extend — except that the
//! first refused attempt of a waiting client marks the holder's row
//! `waiting`, once per grant. Release is one compare-and-free `UPDATE`
//! that sends `pg_notify` in the same statement only when the row is so
//! marked: a release nobody waits for sends no NOTIFY (each NOTIFY takes a
//! database-wide lock at commit, which serializes every notifying commit
//! with its WAL flush and defeats group commit). Marking and release both
//! lock the row, so a wake-up is never lost (`src/sql/claims.sql`). An
//! uncontended acquire + release is two calls, two round trips, two
//! commits, each an in-place (HOT) update of one row: the same as the
//! bare lease-table cycle. Clients of layout 10 (which insert rows under
//! a per-name advisory lock and delete them at release) stay monotonic
//! beside upgraded ones only while none of them force-releases and none
//! of their inserts stalls, between its token and its index entry, for
//! longer than a TTL plus the grace (`src/sql/claims.sql`; a force release
//! from a layout-10 client during the upgrade can let a stalled insert of
//! one land with a lower token, a known defect): upgrade every client.
//!
//! A late attempt (layout 12, `coord_core::late`): a lock, lease or
//! campaign attempt that its client gave up on (its call timed out on a
//! slow network, or the acquire was cancelled mid-call) may still reach
//! the server after the acquire ended and released. It takes nothing:
//! every attempt carries the client's stamp, the release (revoke,
//! resignation) of an owner with an unanswered attempt goes through
//! `claim_leave`, which also marks the owner as left on the name's row for
//! [`CLAIM_LEFT_TTL`] (30 s), and an attempt of that owner stamped before
//! the mark is refused. The mark is on the row, so the row lock orders a
//! late attempt and the marking release either way (`tests/it/late_claims.rs`
//! forces both orders). Releases after answered attempts are the plain
//! statement and mark nothing. Clients of layout 11 and before send no
//! stamp and are never refused.
//!
//! Every statement runs in its own transaction, at READ COMMITTED (see
//! "Transaction isolation"), with
//! `statement_timeout = <call timeout>`, `lock_timeout = 0` (a step waits
//! for a name's lock as long as its call may take, whatever the role's or
//! database's `lock_timeout`) and `synchronous_commit` raised to
//! `on` when the server's or the role's default is `off` or `local`. On a
//! direct connection (see
//! [`PostgresBuilder::prepared_statements`]) these are session settings,
//! sent once when a pooled connection opens, together with
//! `plan_cache_mode = force_generic_plan`, and each call is its one
//! prepared statement alone (Bind/Execute, autocommit). Elsewhere (behind
//! PgBouncer) every call is `BEGIN ISOLATION LEVEL READ COMMITTED; SET
//! LOCAL ...`, the statement and `COMMIT`, pipelined in one round trip. So grants (locks, leases, terms,
//! barrier arrivals, fencing tokens) are durable whatever the defaults, and
//! the server gives up when the client does. When the client's call
//! timeout passes first, the connection is discarded and a cancel request
//! stops its statement on the server. Pooled connections (also those you
//! take from [`PostgresBackend::pool`]) carry these session settings.
//!
//! The pool opens connections as concurrent calls need them, up to
//! [`PostgresBuilder::pool_size`] (default 32, URL `coord_pool_size`);
//! calls beyond wait in FIFO order within their call timeout. The server
//! flushes concurrent commits together, so throughput under load grows
//! with the connections in use.
//!
//! | trait | statements (one round trip each) |
//! |---|---|
//! | [`Lock`](coord_core::Lock) | `try_acquire`: the take, or `claim_acquire`, above; `release` / `force_release`: one `UPDATE ... RETURNING` that frees the row in place, with `pg_notify` when a waiter marked the row; `extend`: one compare-and-expire `UPDATE`; `try_acquire_with_metadata`: the same, the metadata stored by the statement that makes a new grant; `inspect`: one `SELECT` |
//! | [`Lease`](coord_core::Lease) | the same statements on `kind = 'lease'` (no NOTIFY); `remaining`, `inspect`: one `SELECT` each |
//! | [`Election`](coord_core::Election) | `claim_acquire` on `kind = 'election'` with the candidate, sending NOTIFY when a new term starts; `resign` frees the row and notifies; `leader`: one `SELECT`; `inspect`: one `SELECT` of the candidate, owner, term and remaining time |
//! | [`FencingSource`](coord_core::FencingSource) | `SELECT fencing_next()` |
//! | [`Barrier`](coord_core::Barrier) | `arrive`: one call of `barrier_arrive` (row locked `FOR UPDATE`, NOTIFY on completion); `is_complete`, `withdraw`: one statement each |
//! | [`Limiter`](coord_core::Limiter) | one call of `limiter_check` |
//! | [`Semaphore`](coord_core::Semaphore) | `try_acquire`: one call of `semaphore_acquire`, pipelined with the update that makes a grant durable (see "Semaphores"); `release` / `force_release`: one function call each, NOTIFY to the waiters made grantable; `extend`: one compare-and-expire `UPDATE`; `try_acquire_with_metadata`: as `try_acquire`, the metadata stored with a new grant; `inspect`: one `SELECT` (live grants with permits, live queued waiters counted) |
//! | [`Queue`](coord_core::Queue) | `push`, `try_pop`, `ack`, `nack`, `redrive`, `purge`: one function call each, pipelined with the statement that makes it durable (see "Work queues"); an empty pop is one plain read; `extend`: one call of `queue_extend` (compare-and-expire under the message's row lock); `peek`, `stats`: one `SELECT` |
//!
//! Rate limiting: every algorithm decides on the database clock, read
//! AFTER the key's row lock is taken, so a check that waited for the lock
//! across a window boundary decides on the time it got it (windows never
//! move backwards). A check first decides on an unlocked read; a denial
//! found there is final (admissions only ever add to the state) and writes
//! nothing. An admission is decided again and recorded under the row lock.
//! The state keeps the quota it was written under, so a quota change
//! carries it over and never grants a fresh allowance (see
//! `src/sql/limiter.sql` for each algorithm's rule; GCRA is exact numeric
//! arithmetic). Limiter commits are asynchronous
//! (`synchronous_commit = off`, local to that transaction), so a hot key is
//! not held to one check per WAL flush; a server crash may forget the last
//! fraction of a second of admissions.
//!
//! Behind PgBouncer no session state is used (no advisory session locks,
//! no session settings, no named prepared statements: every statement goes
//! out as one unnamed, typed Parse/Bind/Execute), so statements work
//! through PgBouncer in transaction pooling mode.
//!
//! ## Transaction isolation
//!
//! coord's steps are correct only at READ COMMITTED. Each takes the
//! name's lock (an advisory lock, or the row's) and then decides on the
//! rows as the previous holder left them, which only a statement snapshot
//! taken after the lock shows. At REPEATABLE READ or SERIALIZABLE the
//! snapshot is taken before the lock is granted, so a step that waited for
//! it would decide on rows that have changed since: a semaphore would
//! grant the same permit again (up to all 16 of 16 concurrent attempts on
//! one permit were granted in the test that found it), and the other
//! primitives would fail under contention with serialization errors.
//!
//! So every step runs at read committed whatever the server's, the
//! database's or the role's `default_transaction_isolation`, with no extra
//! round trip: a call's `BEGIN` is `BEGIN ISOLATION LEVEL READ COMMITTED`
//! (per transaction, so it holds through PgBouncer in transaction mode,
//! where no session setting survives between transactions); on a direct
//! connection with prepared statements the session settings include
//! `default_transaction_isolation = 'read committed'` (so your own
//! statements on connections of [`PostgresBackend::pool`] default to it
//! too; `BEGIN ISOLATION LEVEL ...` still chooses another for your
//! transaction); the first-use DDL sets it for its transaction. It is not
//! a startup parameter (`options=-c ...`): PgBouncer refuses unknown
//! startup parameters, or drops them silently when they are listed in its
//! `ignore_startup_parameters`.
//!
//! As a last line, every function that decides (and the lock `INSERT`)
//! checks `transaction_isolation` first and, at any other level, refuses
//! and changes nothing: [`Error::Config`](coord_core::Error::Config),
//! naming the fix. That only happens when something changes the session of
//! one of coord's connections after it opened, with prepared statements
//! on: `SET default_transaction_isolation` on a connection taken from
//! [`PostgresBackend::pool`], or a pooler that does not keep one server
//! session per client connection. Leave that setting alone on coord's
//! connections, and turn prepared statements off behind such a pooler.
//!
//! ## Semaphores
//!
//! FIFO ([`Semaphore::fifo`](coord_core::Semaphore::fifo) is true): a
//! request is granted only if it and every live request queued ahead of
//! it fit into the free permits together; a single attempt counts the
//! whole queue as ahead of it and leaves nothing behind, a waiting one
//! takes a place in line (numbered from the sequence `semaphore_places`)
//! at its first refusal. A place lasts [`SEMAPHORE_QUEUE_TTL`] (30 s)
//! unless renewed by the waiter's attempts (refusals tell it to come back
//! within [`SEMAPHORE_QUEUE_REFRESH`]; the row is rewritten at most every
//! 5 s), so a dead waiter holds up the line for 30 s at most. There is no
//! row per name: `permits_total` is the total of the name's live rows, so
//! it binds while there are grants or places, and an idle name has no
//! state once its rows are released or swept.
//!
//! Every decision that writes is made under the name's semaphore lock (a
//! transaction-scoped advisory lock, as for claims' grant lock), with the
//! database clock read after it: grants, places, releases of one name are
//! serialized, and each grant draws its fencing token from the `fencing`
//! sequence under it, so tokens rise per name in grant order and never
//! repeat. An attempt first decides on a plain read: a refusal that needs
//! no write (a single attempt; a waiter with a fresh place) is final and
//! writes nothing, so polling waiters take no transaction id. Grants,
//! places and releases commit asynchronously, so the lock is never held
//! across a WAL flush (a hot name would otherwise take one grant per
//! flush); in the same round trip, a second transaction updates the grant's
//! row in place and commits durably, flushing the WAL up to and including
//! the grant. A grant is reported only after that flush; a lost release
//! only returns permits at their TTL. Extend (the grant's row lock only)
//! and force release are durable.
//!
//! A late attempt (its client gave up on it at the call timeout, or the
//! acquire was cancelled mid-call, but it still reaches the server after
//! the acquire ended and released) changes nothing: the release of an
//! owner with an unanswered attempt writes a mark in `semaphore_left`
//! with the client's stamp of the release, lasting
//! [`SEMAPHORE_LEFT_TTL`] (30 s), and an attempt of that owner stamped
//! before it is refused without a write. So it neither queues a place
//! nobody waits for (which would hold up the waiters behind it for 30 s)
//! nor takes permits nobody releases. Releases after answered attempts
//! write no mark.
//!
//! Wake-ups go to individual waiters: a release (or force release, or an
//! attempt that pruned expired rows) sends `semaphore:<owner>:<name>` for
//! each queued waiter it made grantable whose client listens. Without
//! notifications (behind PgBouncer), waiters among the first four in line
//! that fit once the grants return are told to come back within 10 ms
//! rather than a poll interval: only they may take the returned permits.
//!
//! ## Work queues
//!
//! The delivery rule is coord-core's
//! ([`queue_backend`](coord_core::queue_backend)), exactly: FIFO by id
//! within a group, the group with the lowest turn (a virtual clock) first
//! across groups, ordered groups one message at a time, dead letters at
//! the next delivery after `max_deliveries`, one rising token sequence
//! over both lanes. Every step of a queue that writes runs under the
//! queue's lock (a transaction-scoped advisory lock on the queue name),
//! with the database clock read after it: pushes, pops of both lanes,
//! acks, nacks, redrives and purges of one queue are serialized, so the
//! turn order across groups holds exactly and concurrent consumers always
//! get distinct messages. (`FOR UPDATE SKIP LOCKED` would let a consumer
//! pass a candidate another is taking and deliver a later one, which the
//! rule forbids.)
//!
//! The cost of that lock: every writing step of one queue waits for the
//! one before it, so one queue's throughput is bounded by one step at a
//! time on the server, however many producers and consumers it has; more
//! consumers on one queue add waiting, not throughput. The lock is held
//! for the step's execution on the server only (never across a round trip
//! or a WAL flush, see below). Separate queues take separate locks and run
//! in parallel (two names whose 32-bit `hashtext` collide share one); an
//! empty pop (a plain read) and an extend (the message's row lock) take no
//! queue lock. Measured roughly on a loaded 2-core test machine (release
//! build, loopback, each client looping push, pop, ack): one client on one
//! queue made about 2,700 steps/s, eight clients on one queue 1,600 to
//! 2,000, eight clients on eight queues about 3,000 (there bounded by the
//! machine's two cores). A queue that needs more takes more names (shard
//! it, for example by tenant).
//!
//! A pop costs a few index probes whatever the backlog: a
//! message's readiness is a column (`due_at` NULL) brought up to date by
//! the lane's next step when its delay or visibility runs out, and each
//! group's row carries its lowest id and its lowest ready id, so the next
//! delivery is the first row of a partial index on `(turn, ready_id)`.
//! Fencing tokens come from the `fencing` sequence, drawn under the lock;
//! message ids from `queue_ids`, so both keep rising for a queue whose
//! rows went away. The indexes are shaped so that every statement has one
//! index that fits, and the batch statements pick rows by `ctid`, so the
//! plans are right before the tables have statistics too (a plan cached
//! then is kept until the next `ANALYZE`).
//!
//! No step grows with the backlog beyond its batch: a pop makes at most
//! 5,000 messages ready whose time came (delays, lapsed deliveries); when
//! more came due at once, it makes that many ready, delivers nothing and
//! tells the consumer to come back at once (a single attempt may then
//! find nothing), so it never runs into the call timeout, which would
//! roll it back every time; it moves at most 200 dead letters per
//! step, the same way. `purge` deletes 5,000 messages (then dedup
//! ids) per transaction until none is left: atomic for a smaller queue; a
//! message pushed while a larger one is purged may or may not be deleted.
//! `stats` counts the queue's rows.
//!
//! A pop first decides on a plain read: when nothing in the lane is due
//! and no group has a candidate, it is empty and takes no lock, no
//! transaction id and writes nothing, so polling consumers cost no WAL.
//! The steps under the lock commit asynchronously (the lock is never held
//! across a WAL flush; a busy queue would otherwise take one step per
//! flush); in the same round trip a second transaction sets the sequence
//! `queue_flush` (one WAL record and a transaction id) and commits
//! durably, flushing the step with it, before the step is reported. For a
//! pop it finds the delivery by its owner, so an empty pop flushes
//! nothing. So an acknowledged push, delivery (and its token), ack, nack,
//! redrive or purge survives a crash. Extend (the message's row lock
//! only, no queue lock) commits durably itself.
//!
//! Wake-ups: a push without delay, a nack (with a delay too, so a waiter
//! learns when the message comes due), and an ack whose group still
//! has messages in the lane (an ordered group may deliver its next one),
//! send `queue:<lane>:<queue>` (one waiter per client); a redrive sends
//! `queue-all:main:<queue>` (every waiter). Without notifications (behind
//! PgBouncer) waiters poll, at their poll interval or when the lane's next
//! delay or visibility deadline runs out if that is sooner (an empty pop
//! reports it); such a poll is one plain read. Payloads up to 256 KiB
//! ([`DEFAULT_MAX_PAYLOAD`](coord_core::queue_backend::DEFAULT_MAX_PAYLOAD)),
//! stored as `bytea`.
//!
//! ## Bounded state
//!
//! The state of a name that went idle costs nothing in the store once its
//! TTL or window and a grace ([`PostgresBuilder::idle_grace`], default
//! 60 s) have passed:
//!
//! - release, revoke and resign delete the claim row; an expired row is
//!   taken over by the next grant of its name, or deleted by the sweep.
//!   Fencing stays monotonic: every token and term comes from the `fencing`
//!   sequence (through `fencing_next`), drawn in the grant's own
//!   transaction, never from the row.
//! - a limiter key's state (and its sliding-log entries) is deleted once it
//!   decides exactly like no state: fixed window ended, sliding-window
//!   counter two windows on, GCRA's theoretical arrival time passed, no
//!   log entry within the retention. So deleting it changes no decision;
//!   the grace covers the database clock stepping back.
//! - semaphore grants and places are deleted at release (a place also
//!   when granted or when its wait times out); expired ones, and lapsed
//!   marks of owners that left, are pruned by the next write on the name
//!   or deleted by the sweep after the grace.
//! - a queue's message rows are deleted at ack and purge; its group and
//!   clock rows go with the last message of their group or lane, in the
//!   same step; dedup ids stay until their window ends and are deleted by
//!   the sweep after the grace. So a queue with no message and no live
//!   dedup id has no row at all; what stays is schema-wide: the sequences
//!   `queue_ids` (so ids keep rising for the name) and `fencing`.
//! - a barrier row is deleted once it has had no member for the grace
//!   (its last generation completed, or every member withdrew), or no
//!   arrival nor withdrawal for [`PostgresBuilder::barrier_abandon_after`]
//!   (default 24 h: members that died without withdrawing). Generations
//!   come from the sequence, and a generation older than the row is never
//!   reported complete, so a swept barrier used again never lets a waiter
//!   pass a generation that did not fill (a waiter slower than the grace
//!   times out instead).
//!
//! The sweep (function `sweep`, `src/sql/sweep.sql`) deletes up to 1,000
//! rows per table per statement, skipping rows in use (`FOR UPDATE SKIP
//! LOCKED`), with an asynchronous commit. Each client runs it in the
//! background after one of its writes (a grant, an admission, an arrival)
//! at most every [`PostgresBuilder::sweep_every`] (default 10 s; up to
//! 10,000 rows per table each time), and closes pooled connections unused
//! for a minute then; [`PostgresBackend::sweep`] runs it on demand. Dead
//! row versions are left to autovacuum, as for any table.
//!
//! Behind PgBouncer, how soon clients recover after PostgreSQL restarts
//! is PgBouncer's call: once a login to the server fails (as it does while
//! the server is coming back), PgBouncer refuses every client of that pool
//! for `server_login_retry` (15 s by default) before it tries again, and
//! every coord call fails meanwhile. Set `server_login_retry = 1` in
//! `pgbouncer.ini` for recovery within about a second of the server's
//! return (the fault suite runs PgBouncer so; with the default, a crash
//! restart stalled the suite's clients for 3.5-5 s after the server was
//! back).
//!
//! ## Wake-ups
//!
//! Each client opens one extra connection that `LISTEN`s on
//! `<schema>_wake`; payloads are `<kind>:<name>` and are dispatched to the
//! local waiters through [`Wakeups`](coord_core::wake::Wakeups) (one waiter
//! per lock release, every waiter for elections and barriers; semaphore
//! payloads `semaphore:<owner hex>:<name>` address one waiting acquire;
//! queue payloads `queue:<lane>:<queue>` wake one waiter of the lane,
//! `queue-all:<lane>:<queue>` every one). At start the
//! connection sends itself a probe notification; if it does not come back
//! (PgBouncer in transaction mode) or LISTEN fails for good (a refused
//! password, say), [`Capabilities::notifications`](coord_core::Capabilities)
//! is false and waiters poll. When it cannot connect at start (a
//! retryable error), it keeps trying in the background like after a lost
//! connection, and waiters poll until it is in. Give [`PostgresBuilder::listen_url`] a direct URL to keep
//! wake-ups behind PgBouncer, or turn listening off
//! ([`PostgresBuilder::listen`], `coord_listen=false`) to skip the probe,
//! which waits up to 2 s for a notification that never comes. The connection is checked
//! (an empty query, bounded by the connect timeout) every 15 s and at once
//! whenever a statement call times out or gets no connection, so a
//! half-open connection (silently dead path) is replaced within about a
//! call timeout; it reconnects with backoff and
//! then wakes every local waiter once. It ends when the client is dropped.
//!
//! ## Fenced writes
//!
//! [`FencedTable`] updates rows of your own tables only when the caller's
//! fencing token is >= the row's stored token (see
//! `examples/fenced_write.rs`).
//!
//! ## sqlx (feature `sqlx`)
//!
//! For applications on sqlx 0.8 (re-exported as `coord_postgres::sqlx`):
//!
//! - `FencedTable::sqlx_update` / `sqlx_upsert` run the same fenced
//!   statements inside your own `sqlx::Transaction` (`&mut *tx`) or on any
//!   `PgExecutor`, with values bound by sqlx (`SqlxFencedWrite::set`
//!   takes any `Encode + Type<Postgres>`), so the write commits or rolls
//!   back with the rest of your transaction.
//! - `from_sqlx_pool(&pool)` / `from_sqlx_options(&options)` start a
//!   [`PostgresBuilder`] with the pool's connection settings (host or
//!   socket, port, user, password, database, `sslmode`, `sslrootcert`
//!   file, `application_name`, `options`). A setting that cannot be carried
//!   over (client certificates, an inline root certificate) is an
//!   [`Error::Config`](coord_core::Error::Config) naming it. The backend
//!   still runs on tokio-postgres and opens its own connections (its pool
//!   and its LISTEN connection, for the reasons below); the sqlx pool's
//!   connections, size, timeouts and hooks are not shared.
//!
//! ## Why there is no advisory-lock mode
//!
//! Session advisory locks (`pg_advisory_lock`) are faster: no row, no
//! durable commit, and a waiter blocked in the server is handed the lock
//! without a NOTIFY. `coord-bench` runs them beside every PostgreSQL row
//! (peer `pg-advisory`; the README's table, 2026-12-03: coord's cycle
//! 0.45–1.06× theirs with one task, 0.27–0.42× with 32). A mode that
//! took them for locks, with fencing tokens from the `fencing` sequence,
//! was considered for direct connections and not built, because it cannot
//! keep the contract (DESIGN):
//!
//! - **No TTL.** The lock lives as long as its session. A holder whose
//!   process is stopped (SIGSTOP, a long GC pause, a frozen VM) keeps its
//!   connection open and the lock held: on 2026-12-03 a `psql` that took
//!   `pg_advisory_lock(42)` and was then SIGSTOPped still held it 5 s
//!   later (`pg_try_advisory_lock(42)` from another session: false), and
//!   would until TCP keepalive gave up on it (hours by default). Emulating
//!   a TTL means terminating the holder's backend from another session
//!   (`pg_terminate_backend`, which needs `pg_signal_backend`), that is, a
//!   reaper with extra privileges.
//! - **No loss signal before another can hold.** The server frees the
//!   lock when it notices the session gone (an RST, a keepalive timeout),
//!   which the client may learn of only later, or not until its next
//!   statement fails; a half-open connection gives no bound at all. A
//!   lease's deadline, kept by the client from before its request, is what
//!   lets coord say "lost" before anyone else can hold.
//! - **Nothing survives a failover or restart**: advisory locks are not
//!   written to the WAL, so a promoted standby, even a synchronous one,
//!   holds none of them (coord's rows are replicated, so with synchronous
//!   replication every grant survives).
//! - **A connection per holder and per waiter**, pinned for the whole hold:
//!   32 holders need 32 connections, and a cancelled or timed-out waiter's
//!   `pg_advisory_lock` may still be granted later to a session nobody
//!   uses, so the connection must be closed (the late-attempt problem,
//!   which coord solves on the row).
//! - **Not through PgBouncer** in transaction mode (the session goes back
//!   to the pool with the lock).
//!
//! Tokens drawn from the sequence would still rise (with the timeline
//! ranges of "Failover"), but a token only fences writes; it does not give
//! back the exclusion a stopped holder keeps. If a lock held until its
//! session ends is what you want, use advisory locks directly; coord's
//! locks are leases.
//!
//! ## Why tokio-postgres (with deadpool-postgres) and not sqlx
//!
//! - `LISTEN`: tokio-postgres hands out the raw connection, whose
//!   `poll_message` yields notifications; we own that connection's
//!   lifecycle (probe, reconnect, `notify_every`) directly.
//! - PgBouncer: `query_typed` sends one unnamed Parse/Bind/Execute with the
//!   parameter types given, so every statement is one round trip and needs
//!   no named prepared statement (sqlx prepares and caches named
//!   statements per connection, which breaks under transaction pooling
//!   unless disabled).
//! - Size: no macros, no compile-time database, no other drivers; the pool
//!   is the small deadpool-postgres, recycling closed connections
//!   cheaply (`is_closed`) so a server restart heals by itself.
//! - TLS is rustls (ring), with libpq's `sslmode` semantics implemented
//!   here.
#![deny(missing_docs)]

mod backend;
mod builder;
mod config;
mod fenced;
mod listen;
mod sql;
#[cfg(feature = "sqlx")]
mod sqlx_support;

use std::sync::Arc;

pub use backend::{
    CLAIM_LEFT_TTL, PostgresBackend, SEMAPHORE_LEFT_TTL, SEMAPHORE_QUEUE_REFRESH,
    SEMAPHORE_QUEUE_TTL,
};
pub use builder::{
    DEFAULT_BARRIER_ABANDON, DEFAULT_IDLE_GRACE, DEFAULT_POOL_SIZE, DEFAULT_SWEEP_EVERY,
    PostgresBuilder,
};
pub use config::{DEFAULT_SCHEMA, MAX_SCHEMA_LEN, TlsMode};
pub use deadpool_postgres;
pub use fenced::{Column, FencedTable, FencedWrite};
pub use tokio_postgres;

/// The sqlx this crate was built with (feature `sqlx`): use its types
/// (`PgPool`, `Transaction`) to be sure they are the ones
/// [`from_sqlx_pool`] and [`FencedTable::sqlx_update`] take.
#[cfg(feature = "sqlx")]
pub use sqlx;
#[cfg(feature = "sqlx")]
pub use sqlx_support::{SqlxFencedWrite, from_sqlx_options, from_sqlx_pool};

/// Connect with default options (schema `coord`, 5 s call timeout, pool of
/// up to 32, LISTEN on, sweep on). The schema is created on first use.
///
/// Errors: [`Error::Config`](coord_core::Error::Config) for a bad URL,
/// [`Error::Unavailable`](coord_core::Error::Unavailable) when the server
/// cannot be reached, [`Error::Store`](coord_core::Error::Store) when it
/// refuses (authentication, permissions). None of them contains the
/// password.
pub async fn connect(url: &str) -> coord_core::Result<coord_core::Coord> {
    builder(url).connect().await
}

/// Start configuring a connection to `url`.
pub fn builder(url: &str) -> PostgresBuilder {
    PostgresBuilder::new(url)
}

impl PostgresBuilder {
    /// Connect and return a [`Coord`](coord_core::Coord) giving every
    /// primitive.
    pub async fn connect(self) -> coord_core::Result<coord_core::Coord> {
        Ok(self.connect_backend().await?.coord())
    }

    /// Connect and return the backend object itself (for its pool, schema
    /// and channel, or to build a [`Coord`](coord_core::Coord) by hand).
    pub async fn connect_backend(self) -> coord_core::Result<Arc<PostgresBackend>> {
        PostgresBackend::open(self).await
    }
}
