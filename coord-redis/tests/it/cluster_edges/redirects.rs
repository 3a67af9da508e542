//! Calls that meet a slot on the move: the node a client's slot map names
//! answers `MOVED` (the slot moved) or `ASK` (it is moving, and the key
//! left already), without running the call. The client sends the call
//! where the node says, once, and the caller gets its answer (the node
//! there may not have the script cached: the call then sends its source,
//! as anywhere): a fencing `next` is a one-shot call that nothing in
//! coord sends again.

use std::time::Duration;

use conformance::testkit::redis::{self as kit, RedisServer, Resp};

use super::{blocking, connect};

/// `CLUSTER MYID` of `n`.
fn id(n: &RedisServer) -> String {
    n.command(&["CLUSTER", "MYID"])
        .as_str()
        .expect("CLUSTER MYID answers a string")
        .to_string()
}

/// The port of a master of the kit's cluster other than `port`.
fn other_master(port: u16) -> u16 {
    kit::cluster()
        .masters()
        .into_iter()
        .map(RedisServer::port)
        .find(|&p| p != port)
        .expect("another master")
}

/// The running node of the kit's cluster on `port`.
fn node(port: u16) -> &'static RedisServer {
    kit::cluster()
        .nodes()
        .iter()
        .find(|n| n.port() == port)
        .expect("a node of the kit's cluster")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_meeting_a_moved_or_a_moving_slot_is_answered() {
    let name = conformance::unique("redirect");
    let tag = format!("{{{name}}}");
    let c = connect(
        &kit::cluster().url(),
        &(conformance::unique("redirect") + ":"),
    )
    .await
    .unwrap();
    let fencing = c.fencing().unwrap();
    // The client learns the slot map, and the counter's key exists.
    let mut last = fencing.next(&name).await.unwrap();

    // MOVED: the slot moves with its key; the client's map still names
    // the old master.
    let t = tag.clone();
    let (from, to) = blocking(move || {
        let c = kit::cluster();
        let from = c.master_of(&t).port();
        let to = other_master(from);
        c.migrate_slot(&t, node(to), Duration::ZERO);
        // The redirected call meets a node without the script cached
        // (as a promoted replica is): it must send the source then.
        node(to).command(&["SCRIPT", "FLUSH"]);
        (from, to)
    })
    .await;
    let token = fencing
        .next(&name)
        .await
        .expect("a call whose slot moved was not answered");
    assert!(token > last, "{token} after {last}");
    last = token;

    // ASK: the slot moves back; its key has moved, the slot not yet.
    let t = tag.clone();
    let slot = blocking(move || {
        let (back, here) = (node(from), node(to));
        let slot = here
            .command(&["CLUSTER", "KEYSLOT", &t])
            .as_int()
            .expect("CLUSTER KEYSLOT answers an integer")
            .to_string();
        let ok = Resp::Simple("OK".into());
        let (back_id, here_id) = (id(back), id(here));
        assert_eq!(
            back.command(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &here_id]),
            ok
        );
        assert_eq!(
            here.command(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &back_id]),
            ok
        );
        let Resp::Array(Some(keys)) = here.command(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"])
        else {
            panic!("CLUSTER GETKEYSINSLOT did not answer an array");
        };
        let names: Vec<String> = keys
            .iter()
            .filter_map(|k| k.as_str().map(str::to_string))
            .collect();
        assert!(!names.is_empty(), "the counter's key is in its slot");
        let port = from.to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(names.iter().map(String::as_str));
        assert_eq!(here.command(&args), ok, "MIGRATE");
        back.command(&["SCRIPT", "FLUSH"]);
        slot
    })
    .await;
    let asked = fencing.next(&name).await;
    blocking(move || {
        let back_id = id(node(from));
        for m in kit::cluster().masters() {
            m.command(&["CLUSTER", "SETSLOT", &slot, "NODE", &back_id]);
        }
    })
    .await;
    let token = asked.expect("a call whose slot was moving was not answered");
    assert!(token > last, "{token} after {last}");
}
