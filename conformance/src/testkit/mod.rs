//! The test kit: real servers on free loopback ports, started once per test
//! binary and stopped when it exits. One module per store.

pub mod etcd;
pub mod port;
pub mod postgres;
pub mod postgres_failover;
pub mod proxy;
pub mod redis;

use std::path::PathBuf;
use std::sync::OnceLock;

/// The folder test servers keep their data in, chosen once per process:
/// `COORD_TEST_DIR` if set; else `/dev/shm` when it is writable and has at
/// least 2 GiB free; else the system temp dir. On `/dev/shm` (memory) an
/// fsync costs nothing, so etcd (which fsyncs every write on every member)
/// and PostgreSQL (every durable commit) run at the speed of the CPU, not
/// of the machine's disk: on a CI machine with slow fsyncs the suite took
/// twice as long on etcd and its timing margins shrank. What the tests
/// need of the data survives a killed server either way (the kernel keeps
/// what was written); no test simulates a power loss. The choice is
/// printed once on stderr.
pub fn scratch_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let (dir, why) = if let Some(d) = std::env::var_os("COORD_TEST_DIR") {
            (PathBuf::from(d), "COORD_TEST_DIR")
        } else if shm_has_room() {
            (PathBuf::from("/dev/shm"), "memory, 2 GiB or more free")
        } else {
            (
                std::env::temp_dir(),
                "/dev/shm absent, read-only or under 2 GiB free",
            )
        };
        eprintln!("coord testkit: server data under {} ({why})", dir.display());
        dir
    })
    .clone()
}

fn shm_has_room() -> bool {
    const ROOM: u64 = 2 << 30;
    match nix::sys::statvfs::statvfs("/dev/shm") {
        Ok(s) => {
            let free = s.blocks_available().saturating_mul(s.fragment_size());
            free >= ROOM && nix::unistd::access("/dev/shm", nix::unistd::AccessFlags::W_OK).is_ok()
        }
        Err(_) => false,
    }
}
