//! Renewing a claim right after its grant, when the member that answers
//! the renewal applies the leader's log late (as on a loaded 3-node
//! cluster, where an ownership check answered from the member's own state
//! made the conformance case `lease_renew_after_expiry_fails` fail about
//! 1 run in 10 with two busy cores). Made certain here: the follower's
//! link from the leader gets a latency (`PartitionedEtcdCluster`, network
//! namespaces; needs root), the grant goes to the leader and the renewal
//! to that follower, which then has not applied the grant yet. It must
//! answer as the leader would: the claim is live.
//!
//! A transaction of compares only is a serializable read to etcd, which
//! answers it from the member's own state: there it says "not held". The
//! renewal's ownership check must be linearizable, which waits for the
//! member to catch up.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use conformance::testkit::etcd::PartitionedEtcdCluster;
use conformance::testkit::proxy::FaultProxy;
use coord_core::{Attempt, Error, FencingToken, Lease, Lock, OwnerToken};
use coord_etcd::{EtcdBackend, EtcdOptions};
use etcd_client::GetOptions;

/// How late the follower gets what the leader sends it. Each batch of
/// bytes waits this long, so the follower still hears from the leader
/// every 600 ms: well inside its election timeout (1 to 2 s), so nothing
/// else changes. The follower cannot apply an entry before this long
/// after the leader sent it.
const LAG: Duration = Duration::from_millis(600);

/// Long enough that no claim nears its expiry during the test, however
/// loaded the machine; the renewals keep it (the same TTL: the renewal
/// refreshes the claim's lease and checks its key).
const TTL: Duration = Duration::from_secs(20);

/// A client endpoint that forwards new connections to one member or
/// another: [`Switch::to`] points it at a member and closes the open
/// connections, so the backend's next call goes there.
struct Switch {
    proxy: FaultProxy,
    target: Arc<AtomicU16>,
}

impl Switch {
    fn new(port: u16) -> Switch {
        let target = Arc::new(AtomicU16::new(port));
        let t = target.clone();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = FaultProxy::with_listener(listener, move || {
            TcpStream::connect(("127.0.0.1", t.load(Ordering::SeqCst)))
        });
        Switch { proxy, target }
    }

    fn to(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
        self.proxy.reset();
    }
}

/// The revision the member behind `raw` has applied, read from its own
/// state (serializable).
async fn applied(raw: &mut etcd_client::Client) -> i64 {
    let r = raw
        .get(
            "lagging-member-probe",
            Some(GetOptions::new().with_serializable()),
        )
        .await
        .unwrap();
    r.header().unwrap().revision()
}

/// `call` until it is not `Unavailable` (at most 5 times): the first call
/// after [`Switch::to`] may find the connection the switch just closed
/// (a transport error, as after any reset; not what this test is about).
async fn retried<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = coord_core::Result<T>>,
{
    for _ in 0..4 {
        match call().await {
            Err(Error::Unavailable { message, .. }) => {
                eprintln!("{what}: unavailable ({message}); again");
            }
            r => return r.unwrap_or_else(|e| panic!("{what}: {e:?}")),
        }
    }
    call().await.unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_right_after_the_grant_on_a_lagging_member_keeps_the_claim() {
    let cluster = tokio::task::spawn_blocking(|| PartitionedEtcdCluster::start(3))
        .await
        .unwrap();
    let leader = cluster.leader().expect("a leader");
    let lagging = (leader + 1) % cluster.len();
    // What the lagging member dials to reach the leader carries what the
    // leader sends it (appends, heartbeats, read-index answers).
    cluster.link(lagging, leader).latency(LAG);
    let port = |i: usize| cluster.client_proxy(i).port();
    let switch = Switch::new(port(leader));
    let url = format!("etcd://127.0.0.1:{}", switch.proxy.port());
    let backend = EtcdBackend::connect(EtcdOptions::parse(&url).unwrap())
        .await
        .unwrap();
    let raw = etcd_client::Client::connect([cluster.endpoint(lagging)], None)
        .await
        .unwrap();

    // Before each renewal: whether the lagging member has not applied the
    // grant (revision `token`) yet, as its own state shows. A round in
    // which it caught up first (a loaded machine) proves nothing but is
    // still checked; at least one round of each kind must have run behind.
    let behind = |token: FencingToken| {
        let mut raw = raw.clone();
        async move { applied(&mut raw).await < token.0 as i64 }
    };
    let (mut leases_behind, mut locks_behind) = (0, 0);
    const ROUNDS: usize = 5;

    for round in 0..ROUNDS {
        let owner = OwnerToken::random();
        let name = format!("lagging-lease-{round}");
        switch.to(port(leader));
        let granted = retried(&name, || Lease::grant(&*backend, &name, owner.step(), TTL)).await;
        let Attempt::Granted(token) = granted else {
            panic!("{name}: not granted: {granted:?}");
        };
        switch.to(port(lagging));
        leases_behind += usize::from(behind(token).await);
        let renewed = retried(&name, || Lease::renew(&*backend, &name, owner.step(), TTL)).await;
        assert!(
            renewed,
            "{name}: a live lease renewed on a lagging member was not held"
        );
        assert!(retried(&name, || Lease::revoke(&*backend, &name, owner.step())).await);

        let name = format!("lagging-lock-{round}");
        switch.to(port(leader));
        let granted = retried(&name, || {
            Lock::try_acquire(&*backend, &name, owner.step(), TTL)
        })
        .await;
        let Attempt::Granted(token) = granted else {
            panic!("{name}: not granted: {granted:?}");
        };
        switch.to(port(lagging));
        locks_behind += usize::from(behind(token).await);
        let extended = retried(&name, || Lock::extend(&*backend, &name, owner.step(), TTL)).await;
        assert!(
            extended,
            "{name}: a held lock extended on a lagging member was not held"
        );
        assert!(retried(&name, || Lock::release(&*backend, &name, owner.step())).await);
    }
    assert!(
        leases_behind > 0 && locks_behind > 0,
        "the member was never behind: leases {leases_behind}, locks {locks_behind} of {ROUNDS} \
         rounds (the run proves nothing)"
    );
    cluster.link(lagging, leader).heal();
}
