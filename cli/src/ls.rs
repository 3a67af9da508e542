//! `coord ls [KIND] [--prefix P] [--json]`: what is held now, by kind:
//! the names the store lists (`Coord::list`), each inspected as
//! `coord inspect` does; names whose claim ended meanwhile are left out.

use std::process::ExitCode;

use coord::{Coord, Error, Listed};
use serde_json::{Value, json};

use crate::inspect::{self, Kind};

/// The listed kind of an inspected one.
fn listed(kind: Kind) -> Listed {
    match kind {
        Kind::Lock => Listed::Lock,
        Kind::Lease => Listed::Lease,
        Kind::Election => Listed::Election,
        Kind::Semaphore => Listed::Semaphore,
        Kind::Rwlock => Listed::RwLock,
        Kind::Queue => Listed::Queue,
    }
}

/// Every kind, in the order they are printed.
const KINDS: [Kind; 6] = [
    Kind::Lock,
    Kind::Lease,
    Kind::Election,
    Kind::Semaphore,
    Kind::Rwlock,
    Kind::Queue,
];

/// Everything held of `only` (every kind the store offers when `None`)
/// under `prefix`, at most `limit` names per kind: a JSON array of
/// `{"kind", "name", ...}` (the fields of `inspect --json`), or a block
/// per name for people. Asked for one kind the store cannot list, it
/// fails with the store's reason; asked for all, it says on stderr which
/// kinds it left out and why.
pub async fn ls(
    coord: &Coord,
    only: Option<Kind>,
    prefix: &str,
    limit: usize,
    json: bool,
) -> Result<ExitCode, Error> {
    let kinds: Vec<Kind> = only.map_or(KINDS.to_vec(), |k| vec![k]);
    let mut out = Vec::new();
    for kind in kinds {
        let names = match coord.list(listed(kind), prefix, limit).await {
            Ok(names) => names,
            Err(e @ Error::Unsupported { .. }) if only.is_none() => {
                eprintln!("coord ls: {} left out: {e}", listed(kind).as_str());
                continue;
            }
            Err(e) => return Err(e),
        };
        for name in names {
            let v = inspect::describe(coord, kind, &name).await?;
            if inspect::held(kind, &v) {
                out.push((kind, name, v));
            }
        }
    }
    if json {
        let all: Vec<Value> = out
            .into_iter()
            .map(|(kind, name, v)| {
                let mut entry = json!({"kind": listed(kind).as_str(), "name": name});
                if let (Value::Object(e), Value::Object(fields)) = (&mut entry, v) {
                    e.extend(fields);
                }
                entry
            })
            .collect();
        println!("{}", Value::Array(all));
    } else {
        for (kind, name, v) in out {
            println!("{} {name}", listed(kind).as_str());
            for line in inspect::plain(kind, &v).lines() {
                println!("  {line}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
