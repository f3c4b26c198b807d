//! The checker's own test: each kind of anomaly it claims to see, planted
//! in a small history.

use super::*;

/// Whether the checker reports an anomaly saying `what`.
fn finds(ops: &[Op], end: &Final, what: &str) -> bool {
    check(ops, end).iter().any(|a| a.what.contains(what))
}

fn op(start: u64, end: u64, call: Call, outcome: Outcome) -> Op {
    Op {
        client: 0,
        start,
        end,
        call,
        outcome,
    }
}

fn set(key: &str, value: i64) -> Call {
    Call::Set {
        key: key.into(),
        value,
        expected: None,
        request_id: None,
    }
}

fn quiet_end(histories: BTreeMap<String, Vec<(i64, Option<i64>)>>) -> Final {
    let searched = histories
        .iter()
        .map(|(key, versions)| {
            let live = versions.last().and_then(|&(v, value)| Some((v, value?)));
            (key.clone(), live)
        })
        .collect();
    Final {
        searched,
        histories,
        feed: vec![(1, 1, "k0".into(), 1), (2, 1, "k0".into(), 2)],
        episodes: vec![],
        watched: vec![vec![(1, 1, "k0".into(), 1), (2, 1, "k0".into(), 2)]],
        tailed: vec![],
        promoted: 0,
        imports: BTreeMap::new(),
        tasks: BTreeMap::new(),
    }
}

/// The checker must see each kind of anomaly it claims to: a test of
/// the test.
#[test]
fn the_checker_finds_planted_anomalies() {
    let ops = vec![
        op(0, 10, set("k0", 1), Outcome::Wrote { version: 1 }),
        op(20, 30, set("k0", 2), Outcome::Wrote { version: 2 }),
    ];
    let good = BTreeMap::from([("k0".to_owned(), vec![(1, Some(1)), (2, Some(2))])]);
    assert!(check(&ops, &quiet_end(good.clone())).is_empty());

    // A lost acknowledged write.
    let lost = BTreeMap::from([("k0".to_owned(), vec![(1, Some(1)), (2, Some(9))])]);
    assert!(finds(&ops, &quiet_end(lost), "acknowledged as"));

    // A gap in the versions.
    let gap = BTreeMap::from([("k0".to_owned(), vec![(1, Some(1)), (3, Some(2))])]);
    assert!(finds(&ops, &quiet_end(gap), "dense"));

    // A stale read: v1 read after v2 was acknowledged.
    let mut stale = ops.clone();
    stale.push(op(
        40,
        50,
        Call::Get { key: "k0".into() },
        Outcome::Read {
            version: 1,
            value: 1,
        },
    ));
    let found = check(&stale, &quiet_end(good.clone()));
    assert!(
        found
            .iter()
            .any(|a| a.what.contains("stale read") && a.ops.len() == 2)
    );

    // A stale search hit, and a search and a get that miss a write
    // acknowledged before they started.
    for (call, outcome) in [
        (
            Call::Search { key: "k0".into() },
            Outcome::Read {
                version: 1,
                value: 1,
            },
        ),
        (Call::Search { key: "k0".into() }, Outcome::Absent),
        (
            Call::Get { key: "k0".into() },
            Outcome::Refused {
                code: Code::NotFound,
                reason: "KEY_NOT_FOUND".into(),
            },
        ),
    ] {
        let mut missed = ops.clone();
        missed.push(op(40, 50, call, outcome));
        let found = check(&missed, &quiet_end(good.clone()));
        assert!(
            found.iter().any(|a| (a.what.contains("stale read")
                || a.what.contains("not found once acknowledged"))
                && a.ops.len() == 2),
            "{:?}",
            found.iter().map(|a| &a.what).collect::<Vec<_>>()
        );
    }
    // A miss is no anomaly when a delete could have landed before it.
    let mut deleted = ops.clone();
    deleted.push(op(
        35,
        45,
        Call::Delete { key: "k0".into() },
        Outcome::Wrote { version: 3 },
    ));
    deleted.push(op(
        40,
        50,
        Call::Search { key: "k0".into() },
        Outcome::Absent,
    ));
    let tombstoned =
        BTreeMap::from([("k0".to_owned(), vec![(1, Some(1)), (2, Some(2)), (3, None)])]);
    assert!(check(&deleted, &quiet_end(tombstoned.clone())).is_empty());
    // Nor when a delete whose client gave up before the write began
    // landed after it; one acknowledged then is no excuse.
    let gave_up = |outcome: Outcome, set_version: i64| {
        vec![
            op(0, 10, set("k0", 1), Outcome::Wrote { version: 1 }),
            op(12, 15, Call::Delete { key: "k0".into() }, outcome),
            op(
                20,
                30,
                set("k0", 2),
                Outcome::Wrote {
                    version: set_version,
                },
            ),
            op(40, 50, Call::Search { key: "k0".into() }, Outcome::Absent),
        ]
    };
    let unknown = Outcome::Unknown {
        code: Code::Cancelled,
        transport: false,
    };
    assert!(check(&gave_up(unknown, 2), &quiet_end(tombstoned)).is_empty());
    let deleted_first =
        BTreeMap::from([("k0".to_owned(), vec![(1, Some(1)), (2, None), (3, Some(2))])]);
    assert!(finds(
        &gave_up(Outcome::Wrote { version: 2 }, 3),
        &quiet_end(deleted_first),
        "not found once acknowledged"
    ));
    // The search index disagreeing with the data once quiet.
    let mut disagrees = quiet_end(good.clone());
    disagrees.searched.insert("k0".into(), Some((1, 1)));
    assert!(finds(&ops, &disagrees, "disagrees"));

    // A read as of a revision that answers another version than the
    // feed holds there.
    let read_at_1 = |version: i64| {
        op(
            40,
            50,
            Call::GetAt {
                key: "k0".into(),
                revision: 1,
            },
            Outcome::Read {
                version,
                value: version,
            },
        )
    };
    let mut as_of = ops.clone();
    as_of.push(read_at_1(1));
    assert!(check(&as_of, &quiet_end(good.clone())).is_empty());
    as_of.push(read_at_1(2));
    let found = check(&as_of, &quiet_end(good.clone()));
    assert!(found.iter().any(|a| a.what.contains("as of revision 1")));

    // A value stored twice (a retried write applied twice).
    let twice = BTreeMap::from([("k0".to_owned(), vec![(1, Some(1)), (2, Some(1))])]);
    assert!(finds(&ops, &quiet_end(twice), "twice"));

    // A watch consumer that missed a change.
    let mut gap_in_watch = quiet_end(good);
    gap_in_watch.watched = vec![vec![(2, 1, "k0".into(), 2)]];
    assert!(finds(&ops, &gap_in_watch, "diverges"));

    // A listing that misses an acknowledged append, and one with a gap.
    let appended = op(
        0,
        10,
        Call::Append {
            session: "s0".into(),
            id: "e1".into(),
            value: 1,
        },
        Outcome::Appended {
            seq: 1,
            replayed: false,
        },
    );
    let mut listed = quiet_end(BTreeMap::new());
    listed.episodes = vec![
        (1, "e1".into(), "s0".into(), 1, 100),
        (2, "e2".into(), "s0".into(), 2, 200),
    ];
    listed.tailed = vec![listed.episodes.clone()];
    listed.promoted = 2;
    let listing = |after_seq: i64, got: Vec<(i64, String)>| {
        op(
            20,
            30,
            Call::ListEpisodes {
                session: "s0".into(),
                after_seq,
            },
            Outcome::Episodes(got),
        )
    };
    let whole = vec![(1, "e1".to_owned()), (2, "e2".to_owned())];
    assert!(check(&[appended.clone(), listing(0, whole)], &listed).is_empty());
    let found = check(&[appended.clone(), listing(0, vec![])], &listed);
    assert!(
        found
            .iter()
            .any(|a| a.what.contains("misses e1") && a.ops.len() == 2)
    );
    let found = check(
        &[appended.clone(), listing(0, vec![(2, "e2".to_owned())])],
        &listed,
    );
    assert!(found.iter().any(|a| a.what.contains("a gap")));

    // Recent: another session's episode, a wrong order, an acknowledged
    // episode missing below the limit, and one newer than the oldest given.
    let appended_e2 = op(
        0,
        10,
        Call::Append {
            session: "s0".into(),
            id: "e2".into(),
            value: 2,
        },
        Outcome::Appended {
            seq: 2,
            replayed: false,
        },
    );
    let recent = |session: &str, limit: i64, got: &[&str]| {
        let got = got
            .iter()
            .map(|id| match *id {
                "e1" => (100, 1, "e1".to_owned(), "s0".to_owned(), 1),
                _ => (200, 2, "e2".to_owned(), "s0".to_owned(), 2),
            })
            .collect();
        let ops = [
            appended.clone(),
            appended_e2.clone(),
            op(
                20,
                30,
                Call::Recent {
                    session: Some(session.into()),
                    limit,
                },
                Outcome::Recent(got),
            ),
        ];
        check(&ops, &listed)
            .into_iter()
            .map(|a| a.what)
            .collect::<Vec<_>>()
    };
    assert_eq!(recent("s0", 2, &["e2", "e1"]), Vec::<String>::new());
    assert_eq!(recent("s0", 1, &["e2"]), Vec::<String>::new());
    assert!(recent("s1", 2, &["e2"])[0].contains("gives e2 of session s0"));
    assert!(recent("s0", 2, &["e1", "e2"])[0].contains("not newest first"));
    assert!(recent("s0", 5, &["e2"])[0].contains("misses e1"));
    assert!(recent("s0", 1, &["e1"])[0].contains("misses e2"));

    // An episode promoted twice.
    let mut twice_promoted = quiet_end(BTreeMap::new());
    twice_promoted.episodes = vec![(1, "e1".into(), "s0".into(), 1, 100)];
    twice_promoted.tailed = vec![twice_promoted.episodes.clone()];
    twice_promoted.promoted = 2;
    assert!(finds(&[], &twice_promoted, "promoted"));

    // Imports: whole or nothing, whole when acknowledged, nothing when
    // refused.
    let import = |outcome: Outcome, held: (usize, usize)| {
        let ops = [op(0, 10, Call::Import { id: "i".into() }, outcome)];
        let mut end = quiet_end(BTreeMap::new());
        end.imports.insert("i".into(), held);
        check(&ops, &end)
            .into_iter()
            .map(|a| a.what)
            .collect::<Vec<_>>()
    };
    let unknown = || Outcome::Unknown {
        code: Code::Unavailable,
        transport: true,
    };
    let refused = || Outcome::Refused {
        code: Code::InvalidArgument,
        reason: "IMPORT_MALFORMED".into(),
    };
    assert!(import(Outcome::Done, (2, 2)).is_empty());
    assert!(import(unknown(), (2, 2)).is_empty());
    assert!(import(unknown(), (0, 0)).is_empty());
    assert!(import(refused(), (0, 0)).is_empty());
    assert!(import(unknown(), (2, 0))[0].contains("landed in part"));
    assert!(import(Outcome::Done, (1, 2))[0].contains("landed in part"));
    assert!(import(Outcome::Done, (0, 0))[0].contains("acknowledged and is missing"));
    assert!(import(refused(), (2, 2))[0].contains("refused and landed"));

    // Keyed creations: one task per request id, kept as acknowledged.
    let create = |outcome: Outcome| {
        let call = Call::CreateTask {
            session: "s0".into(),
            request_id: "t-1".into(),
        };
        op(0, 10, call, outcome)
    };
    let created = || Outcome::Created { task: "t1".into() };
    let tasked = |ops: &[Op], held: &[(&str, &str, &str)]| {
        let mut end = quiet_end(BTreeMap::new());
        for (session, id, subject) in held {
            end.tasks
                .entry((*session).to_owned())
                .or_default()
                .push(((*id).to_owned(), (*subject).to_owned()));
        }
        check(ops, &end)
            .into_iter()
            .map(|a| a.what)
            .collect::<Vec<_>>()
    };
    let once = [("s0", "t1", "t-1")];
    assert!(tasked(&[create(unknown()), create(created())], &once).is_empty());
    assert!(tasked(&[create(unknown())], &[]).is_empty());
    assert!(tasked(&[create(refused())], &[]).is_empty());
    let twice = [("s0", "t1", "t-1"), ("s0", "t2", "t-1")];
    assert!(tasked(&[create(unknown()), create(created())], &twice)[0].contains("created 2 tasks"));
    assert!(tasked(&[create(created())], &[])[0].contains("acknowledged as s0/t1"));
    let other_answer = Outcome::Created { task: "t2".into() };
    assert!(tasked(&[create(created()), create(other_answer)], &once)[0].contains("as s0/t2"));
    assert!(tasked(&[create(refused())], &once)[0].contains("refused on every try"));
    assert!(tasked(&[], &once)[0].contains("never asked for"));
}
