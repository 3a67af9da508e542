//! Unit and property tests of the barrier state: generations, duplicate
//! and late arrivals, withdrawals, encoding.

use super::*;

/// A late copy of an arrival whose generation completed, landing after
/// a later generation completed too, is refused: it never counts as a
/// member of the open generation.
#[test]
fn a_late_copy_of_an_arrival_two_generations_back_is_refused() {
    let mut b = BarrierState::new(1);
    let old = OwnerToken::random();
    b.arrive("x", 2, "p", &old, |g| g + 1).unwrap();
    b.arrive("x", 2, "q", &OwnerToken::random(), |g| g + 1)
        .unwrap();
    b.arrive("x", 2, "p", &OwnerToken::random(), |g| g + 1)
        .unwrap();
    b.arrive("x", 2, "q", &OwnerToken::random(), |g| g + 1)
        .unwrap();
    assert_eq!(b.generation, 3);
    assert!(matches!(
        b.arrive("x", 2, "p", &old, |g| g + 1),
        Err(Error::ArrivalLost { .. })
    ));
    assert!(b.arrived.is_empty(), "the late copy counted: {b:?}");
    let round = BarrierState::decode(&b.encode()).unwrap();
    assert_eq!(round, b);
}

#[test]
fn generations_duplicates_mismatch_and_withdraw() {
    let ids: Vec<OwnerToken> = (0..4).map(|_| OwnerToken::random()).collect();
    let mut b = BarrierState::new(7);
    let (a, changed) = b.arrive("x", 2, "p1", &ids[0], |g| g + 1).unwrap();
    assert_eq!((a.generation, a.complete, changed), (7, false, true));
    let (a, changed) = b.arrive("x", 2, "p1", &ids[0], |g| g + 1).unwrap();
    assert_eq!((a.generation, a.complete, changed), (7, false, false));
    let e = b.arrive("x", 3, "p2", &ids[1], |g| g + 1).unwrap_err();
    assert!(matches!(
        e,
        Error::InvalidArgument {
            field: "parties",
            ..
        }
    ));
    assert_eq!(b.arrived.len(), 1);
    let round = BarrierState::decode(&b.encode()).unwrap();
    assert_eq!(round, b);
    let (a, _) = b.arrive("x", 2, "p2", &ids[1], |g| g + 1).unwrap();
    assert_eq!((a.generation, a.complete), (7, true));
    assert!(b.is_complete("x", 7).unwrap() && !b.is_complete("x", 8).unwrap());
    assert!(b.is_idle());
    assert_eq!(b.withdraw(7, "p1", &ids[0]), (false, false));
    b.arrive("x", 5, "q", &ids[2], |g| g + 1).unwrap();
    assert_eq!(b.withdraw(8, "q", &ids[2]), (true, true));
    assert_eq!(b.withdraw(8, "q", &ids[2]), (true, false));
    let round = BarrierState::decode(&b.encode()).unwrap();
    assert_eq!(round, b);
    assert!(BarrierState::decode("x").is_none());
}

#[test]
fn a_retried_completing_arrival_does_not_join_the_next_generation() {
    let (a1, a2) = (OwnerToken::random(), OwnerToken::random());
    let mut b = BarrierState::new(1);
    b.arrive("x", 2, "p1", &a1, |g| g + 1).unwrap();
    let (done, _) = b.arrive("x", 2, "p2", &a2, |g| g + 1).unwrap();
    assert_eq!((done.generation, done.complete), (1, true));
    // p2's reply was lost; the retry carries the same arrival id.
    let (retry, changed) = b.arrive("x", 2, "p2", &a2, |g| g + 1).unwrap();
    assert_eq!(
        (retry.generation, retry.complete, changed),
        (1, true, false)
    );
    assert!(b.is_idle(), "no phantom member in generation 2");
    // A new wait of p2 (new id) joins generation 2 as usual.
    let (next, _) = b
        .arrive("x", 2, "p2", &OwnerToken::random(), |g| g + 1)
        .unwrap();
    assert_eq!((next.generation, next.complete), (2, false));
}

#[test]
fn a_late_copy_of_a_withdrawn_arrival_is_refused_before_and_after_its_generation_completes() {
    let (a, b, c) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let mut s = BarrierState::new(1);
    s.arrive("x", 3, "b", &b, |g| g + 1).unwrap();
    s.arrive("x", 3, "a", &a, |g| g + 1).unwrap();
    assert_eq!(s.withdraw(1, "a", &a), (true, true));
    let late = s.arrive("x", 3, "a", &a, |g| g + 1).unwrap_err();
    assert!(matches!(late, Error::ArrivalLost { .. }), "{late:?}");
    let round = BarrierState::decode(&s.encode()).unwrap();
    assert_eq!(round, s);
    let (open, _) = s.arrive("x", 3, "c", &c, |g| g + 1).unwrap();
    assert!(
        !open.complete,
        "2 live participants completed a barrier of 3"
    );
    let (done, _) = s
        .arrive("x", 3, "a", &OwnerToken::random(), |g| g + 1)
        .unwrap();
    assert!(done.complete);
    assert!(
        s.withdrawn.is_empty(),
        "tombstones outlived their generation"
    );
    // The tombstone went with its generation; the withdrawn arrival's
    // stamp did not: a copy landing now counts nowhere either.
    let later = s.arrive("x", 3, "a", &a, |g| g + 1).unwrap_err();
    assert!(matches!(later, Error::ArrivalLost { .. }), "{later:?}");
}

#[test]
fn a_withdraw_names_one_arrival_and_leaves_the_next_wait() {
    let (old, next, other) = (
        OwnerToken::random(),
        OwnerToken::random(),
        OwnerToken::random(),
    );
    let mut s = BarrierState::new(1);
    s.arrive("x", 2, "p1", &old, |g| g + 1).unwrap();
    let (again, changed) = s.arrive("x", 2, "p1", &next, |g| g + 1).unwrap();
    assert_eq!((again.complete, changed), (false, true));
    assert_eq!(s.withdraw(1, "p1", &old), (true, true));
    let (done, _) = s.arrive("x", 2, "p2", &other, |g| g + 1).unwrap();
    assert!(
        done.complete,
        "the next wait was withdrawn with the old one"
    );
}

#[test]
fn a_generation_of_a_lost_state_neither_passes_nor_completes() {
    // A state made again at 10 after the one holding generation 4 was
    // lost.
    let mut s = BarrierState::new(10);
    let e = s.is_complete("x", 4).unwrap_err();
    assert!(matches!(e, Error::ArrivalLost { .. }), "{e:?}");
    let a = OwnerToken::random();
    assert_eq!(s.withdraw(4, "p", &a), (true, true));
    assert!(!s.is_complete("x", 10).unwrap());
    // Text written before births were kept reads as never lost.
    let old = BarrierState::decode("2\n5\n-").unwrap();
    assert_eq!((old.born, old.generation), (0, 5));
}

/// Property tests: random runs of arrivals and withdrawals (a few
/// participants, each with several arrival ids; some arrivals with
/// another party count; withdrawals of the current, a completed, a
/// lost or a later generation) against a model of the rules in
/// [`BarrierState`]'s docs.
mod properties {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// Which generation a withdrawal names.
    #[derive(Debug, Clone, Copy)]
    enum Which {
        /// The current one.
        Current,
        /// One that completed (the current one if none has).
        Completed(u64),
        /// One below the state's birth (the current one if born at 0).
        Lost(u64),
        /// One above the current.
        Later(u64),
    }

    #[derive(Debug, Clone, Copy)]
    enum Op {
        Arrive {
            who: usize,
            id: usize,
            other_parties: bool,
        },
        Withdraw {
            who: usize,
            id: usize,
            which: Which,
        },
    }

    const PARTICIPANTS: usize = 5;
    const IDS: usize = 10;

    fn op() -> impl Strategy<Value = Op> {
        let which = prop_oneof![
            3 => Just(Which::Current),
            1 => any::<u64>().prop_map(Which::Completed),
            1 => any::<u64>().prop_map(Which::Lost),
            1 => (1..4u64).prop_map(Which::Later),
        ];
        prop_oneof![
            4 => (0..PARTICIPANTS, 0..IDS, prop::bool::weighted(0.1)).prop_map(
                |(who, id, other_parties)| Op::Arrive { who, id, other_parties }
            ),
            1 => (0..PARTICIPANTS, 0..IDS, which)
                .prop_map(|(who, id, which)| Op::Withdraw { who, id, which }),
        ]
    }

    /// Arrival id `i`, stamped `i + 1` (ids made later stamp later).
    fn token(i: usize) -> OwnerToken {
        OwnerToken::from_hex(&format!("{:016x}{:016x}", i + 1, i + 1)).unwrap()
    }

    /// The rules, kept as sets: the live arrivals of the current
    /// generation (not withdrawn), its withdrawn ids, the last
    /// completed generation's ids.
    #[derive(Debug, Default)]
    struct Model {
        parties: u32,
        generation: u64,
        born: u64,
        live: Vec<(usize, usize)>,
        withdrawn: BTreeSet<usize>,
        last: Option<(u64, BTreeSet<usize>)>,
        /// Each participant's newest stamp among arrivals that passed or
        /// were withdrawn.
        latest: std::collections::BTreeMap<usize, usize>,
    }

    impl Model {
        fn members(&self) -> usize {
            self.live
                .iter()
                .map(|(who, _)| who)
                .collect::<BTreeSet<_>>()
                .len()
        }
    }

    proptest! {
        /// Generations only rise; a generation completes exactly when
        /// `parties` distinct participants with live arrivals are in
        /// it (a repeated arrival id counts once, a second id of a
        /// participant adds no member, a withdrawn arrival is not
        /// counted, and its id, or any of its participant's no newer, is
        /// refused before and after the generation completes); a retried completing arrival returns its
        /// generation as complete; another party count while busy is
        /// refused; every call that says it changed nothing left the
        /// state as it was; the text form round-trips.
        #[test]
        fn arrivals_and_withdrawals_follow_the_barrier_rules(
            parties in 1..=4u32,
            born in 0..50u64,
            steps in prop::collection::vec(1..=3u64, 64),
            ops in prop::collection::vec(op(), 1..64),
        ) {
            check::arrivals_and_withdrawals_follow_the_barrier_rules(
                parties, born, steps, ops,
            )?;
        }
    }

    /// The properties, as functions (rustfmt formats them; the
    /// `proptest!` block above only draws their inputs).
    mod check {
        use super::*;

        pub(super) fn arrivals_and_withdrawals_follow_the_barrier_rules(
            parties: u32,
            born: u64,
            steps: Vec<u64>,
            ops: Vec<Op>,
        ) -> Result<(), TestCaseError> {
            let mut s = BarrierState::new(born);
            let mut m = Model {
                generation: born,
                born,
                ..Model::default()
            };
            let mut steps = steps.into_iter().cycle();
            for op in ops {
                let before = s.clone();
                match op {
                    Op::Arrive {
                        who,
                        id,
                        other_parties,
                    } => {
                        let asked = if other_parties { parties + 1 } else { parties };
                        let step = steps.next().unwrap();
                        let r = s.arrive("b", asked, &format!("p{who}"), &token(id), |g| g + step);
                        if let Some((g, _)) = m.last.as_ref().filter(|(_, ids)| ids.contains(&id)) {
                            prop_assert_eq!(
                                r.clone().unwrap(),
                                (
                                    Arrival {
                                        generation: *g,
                                        complete: true
                                    },
                                    false
                                ),
                                "a retried completing arrival"
                            );
                        } else if m.withdrawn.contains(&id) {
                            prop_assert!(
                                matches!(r, Err(Error::ArrivalLost { .. })),
                                "a withdrawn arrival id came back: {:?}",
                                r
                            );
                        } else if !m.live.iter().any(|(_, i)| *i == id)
                            && m.latest.get(&who).is_some_and(|s| *s > id)
                        {
                            prop_assert!(
                                matches!(r, Err(Error::ArrivalLost { .. })),
                                "an arrival no newer than one that passed counted: {:?}",
                                r
                            );
                        } else if !m.live.is_empty() && asked != m.parties {
                            prop_assert!(
                                matches!(
                                    r,
                                    Err(Error::InvalidArgument {
                                        field: "parties",
                                        ..
                                    })
                                ),
                                "{:?}",
                                r
                            );
                        } else if m.live.iter().any(|(_, i)| *i == id) {
                            prop_assert_eq!(
                                r.clone().unwrap(),
                                (
                                    Arrival {
                                        generation: m.generation,
                                        complete: false
                                    },
                                    false
                                ),
                                "a repeated arrival"
                            );
                        } else {
                            if m.live.is_empty() {
                                m.parties = asked;
                            }
                            m.live.push((who, id));
                            let (arrival, changed) = r.clone().unwrap();
                            prop_assert!(changed);
                            let complete = m.members() as u64 == u64::from(m.parties);
                            prop_assert_eq!(
                                arrival,
                                Arrival {
                                    generation: m.generation,
                                    complete
                                },
                                "{} members of {}",
                                m.members(),
                                m.parties
                            );
                            if complete {
                                for (w, i) in &m.live {
                                    let s = m.latest.entry(*w).or_default();
                                    *s = (*s).max(i + 1);
                                }
                                let ids = m.live.drain(..).map(|(_, i)| i).collect();
                                m.last = Some((m.generation, ids));
                                m.withdrawn.clear();
                                m.generation += step;
                            }
                        }
                        if let Ok((_, changed)) = r {
                            prop_assert_eq!(changed, s != before, "arrive's changed flag");
                        } else {
                            prop_assert_eq!(&s, &before, "a refused arrival changed the state");
                        }
                    }
                    Op::Withdraw { who, id, which } => {
                        let g = match which {
                            Which::Current => m.generation,
                            Which::Completed(x) if m.generation > m.born => {
                                m.born + x % (m.generation - m.born)
                            }
                            Which::Lost(x) if m.born > 0 => x % m.born,
                            Which::Later(d) => m.generation + d,
                            _ => m.generation,
                        };
                        let r = s.withdraw(g, &format!("p{who}"), &token(id));
                        if g >= m.born && g < m.generation {
                            prop_assert_eq!(
                                r,
                                (false, false),
                                "withdrawn from completed generation {}",
                                g
                            );
                        } else {
                            let n = m.live.len();
                            m.live.retain(|a| *a != (who, id));
                            let tombstoned = m.withdrawn.insert(id);
                            // The withdrawn arrival's stamp joins its
                            // participant's newest.
                            let newest = m.latest.entry(who).or_default();
                            let raised = *newest < id + 1;
                            *newest = (*newest).max(id + 1);
                            prop_assert_eq!(r, (true, m.live.len() != n || tombstoned || raised));
                        }
                        prop_assert_eq!(r.1, s != before, "withdraw's changed flag");
                    }
                }
                prop_assert!(
                    s.generation >= before.generation,
                    "the generation went back"
                );
                prop_assert_eq!(s.generation, m.generation);
                prop_assert_eq!(s.is_idle(), m.live.is_empty() && m.withdrawn.is_empty());
                for g in m.born.saturating_sub(2)..m.generation + 2 {
                    match s.is_complete("b", g) {
                        Ok(done) => prop_assert_eq!(
                            done,
                            g >= m.born && g < m.generation,
                            "generation {}",
                            g
                        ),
                        Err(e) => {
                            let lost = matches!(e, Error::ArrivalLost { .. });
                            prop_assert!(g < m.born && lost, "generation {}: {:?}", g, e);
                        }
                    }
                }
                prop_assert_eq!(BarrierState::decode(&s.encode()), Some(s.clone()));
            }
            Ok(())
        }
    }
}
