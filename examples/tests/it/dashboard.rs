//! `docs/grafana-dashboard.json` is a dashboard Grafana can import, and
//! charts only metrics coord records (the table in `coord::metrics`).

use std::collections::BTreeSet;

fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("coord_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

#[test]
fn the_grafana_dashboard_charts_only_metrics_coord_records() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let json = std::fs::read_to_string(format!("{root}/docs/grafana-dashboard.json"))
        .expect("docs/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut charted = BTreeSet::new();
    for p in panels {
        let targets = p["targets"].as_array().expect("every panel has targets");
        for t in targets {
            let expr = t["expr"].as_str().expect("a PromQL expression");
            charted.extend(metric_names(expr));
        }
    }
    let recorded = metric_names(
        &std::fs::read_to_string(format!("{root}/coord-core/src/metrics.rs"))
            .expect("coord-core/src/metrics.rs"),
    );
    let unknown: Vec<_> = charted.difference(&recorded).collect();
    assert!(
        unknown.is_empty(),
        "charted but never recorded: {unknown:?}"
    );
    for must in ["coord_held", "coord_waiting", "coord_queue_messages"] {
        assert!(charted.contains(must), "{must} is not charted");
    }
}
