//! `coord ls [KIND] [--prefix P] [--json]`: what is held now, by kind:
//! the names the store lists (`Coord::list`), each inspected as
//! `coord inspect` does; names whose claim ended meanwhile are left out.

use std::process::ExitCode;

use coord::{Coord, Error, Listed};
use serde_json::{Value, json};

use crate::inspect::{self, Kind};

/// The listed kind of an inspected one.
pub fn listed(kind: Kind) -> Listed {
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

/// What [`listing`] found: each name held, with what `inspect` read of
/// it, and the kinds left out because the store cannot list them.
pub struct Listing {
    /// Each kind, name and the JSON `inspect --json` prints, in order.
    pub held: Vec<(Kind, String, Value)>,
    /// The kinds the store cannot list (asked for all), with its reason.
    pub left_out: Vec<(Listed, Error)>,
}

impl Listing {
    /// The JSON `coord ls --json` prints: an array of `{"kind", "name",
    /// ...}` with the fields of `inspect --json`.
    pub fn json(&self) -> Value {
        let all = self
            .held
            .iter()
            .map(|(kind, name, v)| {
                let mut entry = json!({"kind": listed(*kind).as_str(), "name": name});
                if let (Value::Object(e), Value::Object(fields)) = (&mut entry, v) {
                    e.extend(fields.clone());
                }
                entry
            })
            .collect();
        Value::Array(all)
    }
}

/// Everything held of `only` (every kind the store offers when `None`)
/// under `prefix`, at most `limit` names per kind, each inspected as
/// `coord inspect` does. Asked for one kind the store cannot list, it
/// fails with the store's reason; asked for all, such kinds are left out
/// ([`Listing::left_out`]).
pub async fn listing(
    coord: &Coord,
    only: Option<Kind>,
    prefix: &str,
    limit: usize,
) -> Result<Listing, Error> {
    let kinds: Vec<Kind> = only.map_or(KINDS.to_vec(), |k| vec![k]);
    let mut found = Listing {
        held: Vec::new(),
        left_out: Vec::new(),
    };
    for kind in kinds {
        let names = match coord.list(listed(kind), prefix, limit).await {
            Ok(names) => names,
            Err(e @ Error::Unsupported { .. }) if only.is_none() => {
                found.left_out.push((listed(kind), e));
                continue;
            }
            Err(e) => return Err(e),
        };
        for name in names {
            let v = inspect::describe(coord, kind, &name).await?;
            if inspect::held(kind, &v) {
                found.held.push((kind, name, v));
            }
        }
    }
    Ok(found)
}

/// `coord ls`: everything held of `only` under `prefix` ([`listing`]), as
/// the JSON of [`Listing::json`] or a block per name for people; the kinds
/// left out are named on stderr with the reason.
pub async fn ls(
    coord: &Coord,
    only: Option<Kind>,
    prefix: &str,
    limit: usize,
    json: bool,
) -> Result<ExitCode, Error> {
    let found = listing(coord, only, prefix, limit).await?;
    for (kind, e) in &found.left_out {
        eprintln!("coord ls: {} left out: {e}", kind.as_str());
    }
    if json {
        println!("{}", found.json());
    } else {
        for (kind, name, v) in &found.held {
            println!("{} {name}", listed(*kind).as_str());
            for line in inspect::plain(*kind, v).lines() {
                println!("  {line}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
