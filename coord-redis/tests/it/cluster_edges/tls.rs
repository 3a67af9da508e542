//! A cluster speaking TLS only (`rediss+cluster://`), started here: the
//! test kit has none.

use std::time::Duration;

use conformance::faults::woken_after_release;
use conformance::testkit::redis::{self as kit};
use coord_redis::RedisOptions;

use super::{TTL, blocking, connect, every_primitive};

/// Six `redis-server` processes speaking TLS only (clients, replication
/// and the cluster bus), joined as a 3-master, 3-replica cluster, with a
/// certificate for 127.0.0.1 signed by a throw-away CA. The test kit has
/// no TLS cluster; these processes are ours, killed by PID when dropped.
struct TlsCluster {
    dir: std::path::PathBuf,
    ports: Vec<u16>,
    children: Vec<std::process::Child>,
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(cmd: &mut std::process::Command) -> String {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run a command");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed: {text}");
    text
}

impl TlsCluster {
    fn start() -> TlsCluster {
        use std::process::Command;
        let dir = std::env::temp_dir().join(conformance::unique("coord-tls-cluster"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth,clientAuth\n",
        )
        .unwrap();
        let openssl = |args: &[&str]| {
            run(Command::new("openssl").args(args).current_dir(&dir));
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=coord test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "key.pem",
            "-out",
            "server.csr",
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
            "-out",
            "cert.pem",
        ]);
        let mut ports = Vec::new();
        let mut children = Vec::new();
        for i in 0..6 {
            let node = dir.join(format!("n{i}"));
            std::fs::create_dir_all(&node).unwrap();
            // A free port may be taken by another test before the server
            // binds it: then start again on another, as the test kit does.
            let mut attempt = 0;
            let (port, child) = loop {
                attempt += 1;
                let port = conformance::testkit::port::free_port();
                let log = node.join(format!("redis-{attempt}.log"));
                let conf = format!(
                    "bind 127.0.0.1\nsave \"\"\nappendonly no\ndaemonize no\nprotected-mode no\n\
                     dir {node}\nport 0\ntls-port {port}\ntls-cert-file {d}/cert.pem\n\
                     tls-key-file {d}/key.pem\ntls-ca-cert-file {d}/ca.pem\n\
                     tls-auth-clients no\ntls-replication yes\ntls-cluster yes\n\
                     cluster-enabled yes\ncluster-config-file nodes.conf\n\
                     cluster-node-timeout 1000\nlogfile {log}\n",
                    node = node.display(),
                    d = dir.display(),
                    log = log.display(),
                );
                std::fs::write(node.join("redis.conf"), conf).unwrap();
                let mut child = Command::new(kit::redis_server_binary())
                    .arg(node.join("redis.conf"))
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .expect("spawn redis-server");
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                let ready = loop {
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    if text.contains("Ready to accept connections") {
                        break true;
                    }
                    if matches!(child.try_wait(), Ok(Some(_))) {
                        break false;
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "TLS node did not start: {text}"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                };
                if ready {
                    break (port, child);
                }
                let _ = child.kill();
                let _ = child.wait();
                assert!(
                    attempt < 5,
                    "TLS node did not start: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            };
            children.push(child);
            ports.push(port);
        }
        let c = TlsCluster {
            dir,
            ports,
            children,
        };
        let cli = |args: &[&str]| {
            let ca = c.dir.join("ca.pem");
            let mut cmd = Command::new(kit::redis_cli_binary());
            cmd.arg("--tls").arg("--cacert").arg(ca).args(args);
            cmd.stdin(std::process::Stdio::null()).output()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        for p in &c.ports {
            let p = p.to_string();
            while !cli(&["-p", &p, "PING"])
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("PONG"))
                .unwrap_or(false)
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "TLS node {p} does not answer PING"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let mut args = vec!["--cluster".to_string(), "create".to_string()];
        args.extend(c.ports.iter().map(|p| format!("127.0.0.1:{p}")));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = cli(&args).expect("redis-cli --cluster create");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(text.contains("All 16384 slots covered"), "{text}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let ok = c.ports.iter().all(|p| {
                cli(&["-p", &p.to_string(), "CLUSTER", "INFO"])
                    .map(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
                    .unwrap_or(false)
            });
            if ok {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "TLS cluster not ok");
            std::thread::sleep(Duration::from_millis(100));
        }
        c
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("rediss+cluster://{}", hosts.join(","))
    }

    fn ca(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.pem")).unwrap()
    }
}

/// `rediss+cluster://` with the CA's certificate: every primitive, and
/// wake-ups, over TLS; without it, a clear certificate error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_works() {
    let cluster = blocking(TlsCluster::start).await;
    let opts = || {
        RedisOptions::new(&cluster.url())
            .prefix("tls:".to_string())
            .tls_root_certificate(cluster.ca())
            .timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_secs(2))
    };
    let a = opts()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("TLS connect: {e}"));
    every_primitive(&a, "job").await.unwrap();
    let b = opts().connect().await.unwrap();
    let took = woken_after_release(&a, b, TTL).await;
    // From before the release call (its round trip included); the
    // waiter polls every 30 s (15 s at the soonest, jittered), so 3 s
    // still tells a wake-up from a poll on a loaded machine.
    assert!(took < Duration::from_secs(3), "woken after {took:?}");
    let e = connect(&cluster.url(), "tls:").await.unwrap_err();
    println!("without the CA: {e}");
    assert!(
        e.to_string().to_lowercase().contains("certificate"),
        "without the CA: {e}"
    );
}
