//! `coord-bench --table RUN...`: the speed table of docs/benchmarks.md from the output
//! of several full runs (each file what one run printed; only its `BENCH`
//! lines are read), every number a min–max range over the runs.
//!
//! ```sh
//! for i in 1 2 3; do cargo run --release -p coord-bench > run$i.txt; done
//! cargo run --release -p coord-bench -- --table run1.txt run2.txt run3.txt
//! ```
//!
//! Rows come in the order of the first run; a row missing from a run
//! spans the runs that have it.

use std::collections::BTreeMap;

/// One `BENCH` line's fields (`key=value`), in a map.
type Fields = BTreeMap<String, String>;

/// The fields of a `BENCH` line, or `None` for any other line.
fn parse(line: &str) -> Option<Fields> {
    let rest = line.strip_prefix("BENCH ")?;
    Some(
        rest.split_whitespace()
            .filter_map(|f| f.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// The number at the start of `v` (`123.4us` → 123.4).
fn number(v: &str) -> Option<f64> {
    let end = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(v.len());
    v[..end].parse().ok()
}

/// Operations per second as the table prints them.
fn rate(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M/s", x / 1e6)
    } else if x >= 1e4 {
        format!("{:.1}k/s", x / 1e3)
    } else {
        format!("{x:.0}/s")
    }
}

/// Microseconds as the table prints them.
fn micros(x: f64) -> String {
    if x < 10.0 {
        format!("{x:.1} µs")
    } else {
        format!("{x:.0} µs")
    }
}

/// `lo–hi` of `f` applied to each value, or one value when they agree.
fn span(values: &[f64], f: impl Fn(f64) -> String) -> String {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (a, b) = (f(lo), f(hi));
    if a == b { a } else { format!("{a}–{b}") }
}

fn fixed(digits: usize) -> impl Fn(f64) -> String {
    move |x| format!("{x:.digits$}")
}

/// The markdown table of `runs` (each the text one full run printed).
pub fn table(runs: &[String]) -> String {
    // Row key (store, op, tasks) → the fields of each run that has it.
    let mut order: Vec<(String, String, String)> = Vec::new();
    let mut rows: BTreeMap<(String, String, String), Vec<Fields>> = BTreeMap::new();
    for run in runs {
        for f in run.lines().filter_map(parse) {
            let get = |k: &str| f.get(k).cloned().unwrap_or_default();
            let key = (get("store"), get("op"), get("tasks"));
            if !rows.contains_key(&key) {
                order.push(key.clone());
            }
            rows.entry(key).or_default().push(f);
        }
    }
    let mut out = String::from(
        "| store | row | tasks | coord | raw | coord ÷ raw | peer | peer ratio | floor | coord ÷ floor |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for key in order {
        let fs = &rows[&key];
        let all = |k: &str| -> Vec<f64> {
            fs.iter()
                .filter_map(|f| f.get(k).and_then(|v| number(v)))
                .collect()
        };
        let peer = fs
            .iter()
            .find_map(|f| f.get("peer").cloned())
            .unwrap_or_default();
        let peer_ratio = match all("peer_ratio") {
            v if v.is_empty() => String::new(),
            v => span(&v, fixed(2)),
        };
        let (floor, floor_ratio) = match all("floor_ratio") {
            v if v.is_empty() => (String::new(), String::new()),
            v => (span(&all("floor"), rate), span(&v, fixed(2))),
        };
        let (coord, raw, ratio) = if key.1.starts_with("handoff") {
            (
                format!("{} (p50)", span(&all("coord"), micros)),
                format!("{} (RTT)", span(&all("rtt"), micros)),
                format!(
                    "{} RTT; {} idle RTT",
                    span(&all("rtt_ratio"), fixed(1)),
                    span(&all("idle_rtt_ratio"), fixed(1))
                ),
            )
        } else {
            (
                span(&all("coord"), rate),
                span(&all("raw"), rate),
                span(&all("ratio"), fixed(2)),
            )
        };
        let (store, op, tasks) = key;
        out.push_str(&format!(
            "| {store} | {op} | {tasks} | {coord} | {raw} | {ratio} | {peer} | {peer_ratio} \
             | {floor} | {floor_ratio} |\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUN1: &str = "\
memory    cycle   1   ...human line...
BENCH store=redis op=cycle tasks=1 coord=9086ops/s raw=10500ops/s ratio=0.865 peer=rslock peer_ratio=0.912 peer_value=9962ops/s peer_p50=98.1us p50=101.0us raw_p50=90.0us
BENCH store=redis op=handoff_shared tasks=8 coord=98.0us raw=21.3us ratio=0.217 peer=rslock peer_ratio=97.170 peer_value=9523.0us peer_p99=20000.0us p99=300.0us rtt=21.3us rtt_ratio=4.60 idle_rtt=88.0us idle_rtt_ratio=1.11 handoffs=900
";
    const RUN2: &str = "\
BENCH store=redis op=cycle tasks=1 coord=11600ops/s raw=12900ops/s ratio=0.899 peer=rslock peer_ratio=0.850 peer_value=13600ops/s peer_p50=80.0us floor=11000ops/s floor_ratio=1.055 p50=90.0us raw_p50=80.0us
BENCH store=redis op=handoff_shared tasks=8 coord=177.0us raw=21.7us ratio=0.123 peer=rslock peer_ratio=44.950 peer_value=7956.0us peer_p99=20000.0us p99=400.0us rtt=21.7us rtt_ratio=8.30 idle_rtt=80.0us idle_rtt_ratio=2.21 handoffs=800
BENCH store=memory op=check tasks=32 coord=4130000ops/s raw=4770000ops/s ratio=0.866
";

    #[test]
    fn ranges_over_the_runs_in_the_first_runs_order() {
        let t = table(&[RUN1.to_string(), RUN2.to_string()]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert_eq!(
            lines[2],
            "| redis | cycle | 1 | 9086/s–11.6k/s | 10.5k/s–12.9k/s | 0.86–0.90 | rslock | 0.85–0.91 \
             | 11.0k/s | 1.05 |"
        );
        assert_eq!(
            lines[3],
            "| redis | handoff_shared | 8 | 98 µs–177 µs (p50) | 21 µs–22 µs (RTT) \
             | 4.6–8.3 RTT; 1.1–2.2 idle RTT | rslock | 44.95–97.17 |  |  |"
        );
        // Only in the second run, no peer, no floor: one value, empty cells.
        assert_eq!(
            lines[4],
            "| memory | check | 32 | 4.13M/s | 4.77M/s | 0.87 |  |  |  |  |"
        );
    }

    #[test]
    fn other_lines_are_not_rows() {
        assert!(parse("memory cycle 1 694947/s").is_none());
        assert_eq!(number("123.5us"), Some(123.5));
        assert_eq!(number("ops/s"), None);
        assert_eq!(micros(3.24), "3.2 µs");
        assert_eq!(rate(999.6), "1000/s");
    }
}
