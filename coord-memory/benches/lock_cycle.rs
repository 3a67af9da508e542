//! Uncontended acquire + release on the in-memory backend, on one core,
//! next to the raw store operation it is built on (insert + remove in a
//! mutex-guarded hash map) measured in the same run. Prints cycles per
//! second and the ratio.
//!
//! `cargo bench -p coord-memory --bench lock_cycle`

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // `cargo bench` passes --bench; under `cargo test` run a quick smoke pass.
    let quick = !std::env::args().any(|a| a == "--bench");
    let n: u32 = if quick { 10_000 } else { 2_000_000 };

    // Raw: what the backend does under its shard mutex, nothing else.
    let map: Mutex<HashMap<Box<str>, u64>> = Mutex::new(HashMap::new());
    let raw = time(n, || {
        let mut m = map.lock().unwrap();
        m.insert("bench".into(), 1);
        black_box(m.remove("bench"));
    });

    let coord = coord_memory::MemoryBackend::coord();
    let locks = coord.locks().expect("locks");
    let ttl = Duration::from_secs(30);
    let cycle = rt.block_on(async {
        let start = Instant::now();
        for _ in 0..n {
            let g = locks
                .try_acquire("bench", ttl)
                .await
                .unwrap()
                .expect("uncontended");
            g.release().await.unwrap();
        }
        start.elapsed() / n
    });

    let per_sec = |d: Duration| 1.0 / d.as_secs_f64();
    println!(
        "raw map insert+remove : {raw:>10.0?} per cycle, {:>12.0} cycles/s",
        per_sec(raw)
    );
    println!(
        "coord acquire+release : {cycle:>10.0?} per cycle, {:>12.0} cycles/s",
        per_sec(cycle)
    );
    println!(
        "ratio coord/raw       : {:.1}x the raw operation's time",
        cycle.as_secs_f64() / raw.as_secs_f64()
    );
}

fn time(n: u32, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed() / n
}
