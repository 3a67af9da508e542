//! Fenced writes to your own tables: the PHP original's
//! `UPDATE ... WHERE fencing_token < ?`, corrected to accept a write iff its
//! token is >= the highest the row has seen, check and update in one
//! statement.

use coord_core::{Error, FencingToken, Result};
use tokio_postgres::GenericClient;
use tokio_postgres::types::{ToSql, Type};

use crate::backend::map_pg;
use crate::config::identifier;

/// One column value of a fenced write: column name, value, and its
/// PostgreSQL type. Types are given so the write is one round trip with no
/// named prepared statement (so it also works through PgBouncer).
pub type Column<'a> = (&'a str, &'a (dyn ToSql + Sync), Type);

/// What a fenced write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedWrite {
    /// The write was applied; the row now carries the caller's token.
    Applied,
    /// The row has seen a higher token: the caller's claim is stale (its
    /// lock expired and somebody else wrote since). Nothing changed.
    Stale,
    /// [`FencedTable::update`] only: there is no row with that key.
    Missing,
}

impl FencedWrite {
    /// Whether the write was applied.
    pub fn applied(self) -> bool {
        self == FencedWrite::Applied
    }
}

/// A table of yours whose rows carry a fencing-token column, written only
/// by holders of a current claim.
///
/// ```sql
/// CREATE TABLE inventory (
///     product_id    text PRIMARY KEY,
///     stock         bigint NOT NULL,
///     fencing_token bigint NOT NULL DEFAULT 0
/// );
/// ```
///
/// ```no_run
/// # async fn demo(client: &tokio_postgres::Client, token: coord_core::FencingToken) -> coord_core::Result<()> {
/// use coord_postgres::{FencedTable, FencedWrite};
/// use coord_postgres::tokio_postgres::types::Type;
/// let table = FencedTable::new("inventory", "product_id", "fencing_token")?;
/// let stock = 41_i64;
/// match table
///     .update(client, (&"sku-1", Type::TEXT), token, &[("stock", &stock, Type::INT8)])
///     .await?
/// {
///     FencedWrite::Applied => println!("written"),
///     FencedWrite::Stale => println!("a newer holder wrote first; our write was refused"),
///     FencedWrite::Missing => println!("no such product"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedTable {
    table: String,
    key_column: String,
    token_column: String,
}

fn quote(ident: &str) -> String {
    format!("\"{ident}\"")
}

impl FencedTable {
    /// Describe the table `table` (optionally `schema.table`), its key
    /// column and its token column (a `bigint`). Identifiers are checked
    /// (ASCII letters, digits, `_`) and always quoted, so they are
    /// case-sensitive: pass them as created.
    pub fn new(table: &str, key_column: &str, token_column: &str) -> Result<FencedTable> {
        let table = match table.split_once('.') {
            Some((schema, t)) => {
                identifier("table", schema, 63)?;
                identifier("table", t, 63)?;
                format!("{}.{}", quote(schema), quote(t))
            }
            None => {
                identifier("table", table, 63)?;
                quote(table)
            }
        };
        identifier("key_column", key_column, 63)?;
        identifier("token_column", token_column, 63)?;
        Ok(FencedTable {
            table,
            key_column: quote(key_column),
            token_column: quote(token_column),
        })
    }

    pub(crate) fn token(token: FencingToken) -> Result<i64> {
        i64::try_from(token.get())
            .map_err(|_| Error::invalid("token", "fencing tokens above i64::MAX cannot be stored"))
    }

    fn check_columns<'c>(&self, set: impl IntoIterator<Item = &'c str>) -> Result<()> {
        let mut seen: Vec<&str> = Vec::new();
        for c in set {
            identifier("column", c, 63)?;
            if seen.contains(&c) {
                return Err(Error::invalid(
                    "column",
                    format!("`{c}` is named twice; name each column to set once"),
                ));
            }
            seen.push(c);
            if quote(c) == self.key_column || quote(c) == self.token_column {
                return Err(Error::invalid(
                    "column",
                    format!("`{c}` is the key or the token column; it is set by the helper"),
                ));
            }
        }
        Ok(())
    }

    /// The statement of a fenced update, shared by every driver: `$1` is
    /// the key, `$2` the token (`bigint`), `$3..` the values of `columns`
    /// in order. Its one row is (applied, the row exists): see
    /// [`update_outcome`](Self::update_outcome).
    pub(crate) fn update_sql(&self, columns: &[&str]) -> Result<String> {
        self.check_columns(columns.iter().copied())?;
        let mut assignments = vec![format!("{} = $2", self.token_column)];
        for (i, c) in columns.iter().enumerate() {
            assignments.push(format!("{} = ${}", quote(c), i + 3));
        }
        Ok(format!(
            "WITH u AS (UPDATE {t} SET {a} WHERE {k} = $1 AND {tok} <= $2 RETURNING 1) \
             SELECT EXISTS (SELECT 1 FROM u), EXISTS (SELECT 1 FROM {t} WHERE {k} = $1)",
            t = self.table,
            a = assignments.join(", "),
            k = self.key_column,
            tok = self.token_column,
        ))
    }

    /// What the row of [`update_sql`](Self::update_sql) means.
    pub(crate) fn update_outcome(applied: bool, exists: bool) -> FencedWrite {
        if applied {
            FencedWrite::Applied
        } else if exists {
            FencedWrite::Stale
        } else {
            FencedWrite::Missing
        }
    }

    /// The statement of a fenced upsert, shared by every driver: the
    /// parameters are numbered as in [`update_sql`](Self::update_sql). It
    /// returns one row iff the write was applied.
    pub(crate) fn upsert_sql(&self, columns: &[&str]) -> Result<String> {
        self.check_columns(columns.iter().copied())?;
        let mut cols = vec![self.key_column.clone(), self.token_column.clone()];
        let mut values = vec!["$1".to_string(), "$2".to_string()];
        let mut updates = vec![format!("{0} = EXCLUDED.{0}", self.token_column)];
        for (i, c) in columns.iter().enumerate() {
            cols.push(quote(c));
            values.push(format!("${}", i + 3));
            updates.push(format!("{0} = EXCLUDED.{0}", quote(c)));
        }
        Ok(format!(
            "INSERT INTO {t} AS t ({cols}) VALUES ({values}) \
             ON CONFLICT ({k}) DO UPDATE SET {updates} WHERE t.{tok} <= EXCLUDED.{tok} \
             RETURNING 1",
            t = self.table,
            cols = cols.join(", "),
            values = values.join(", "),
            k = self.key_column,
            updates = updates.join(", "),
            tok = self.token_column,
        ))
    }

    /// What [`upsert_sql`](Self::upsert_sql) returning a row or not means.
    pub(crate) fn upsert_outcome(returned_a_row: bool) -> FencedWrite {
        if returned_a_row {
            FencedWrite::Applied
        } else {
            FencedWrite::Stale
        }
    }

    fn params<'a>(
        key: (&'a (dyn ToSql + Sync), Type),
        token: &'a i64,
        set: &[Column<'a>],
    ) -> (Vec<&'a str>, Vec<(&'a (dyn ToSql + Sync), Type)>) {
        let mut params = vec![key, (token as &(dyn ToSql + Sync), Type::INT8)];
        let mut names = Vec::with_capacity(set.len());
        for (c, v, ty) in set {
            names.push(*c);
            params.push((*v, ty.clone()));
        }
        (names, params)
    }

    /// Update the row with `key` iff `token` >= its stored token, setting
    /// `set` and the token column to `token`. One statement:
    /// `UPDATE t SET .., token = $2 WHERE key = $1 AND token <= $2`.
    pub async fn update<C: GenericClient + Sync>(
        &self,
        client: &C,
        key: (&(dyn ToSql + Sync), Type),
        token: FencingToken,
        set: &[Column<'_>],
    ) -> Result<FencedWrite> {
        let t = Self::token(token)?;
        let (names, params) = Self::params(key, &t, set);
        let sql = self.update_sql(&names)?;
        let rows = client
            .query_typed(&sql, &params)
            .await
            .map_err(|e| map_pg("fenced update", e))?;
        let row = rows.first().ok_or_else(|| Error::Store {
            backend: "postgres",
            operation: "fenced update",
            message: "no result row".into(),
            source: None,
        })?;
        let applied: bool = row.try_get(0).map_err(|e| map_pg("fenced update", e))?;
        let exists: bool = row.try_get(1).map_err(|e| map_pg("fenced update", e))?;
        Ok(Self::update_outcome(applied, exists))
    }

    /// Insert the row, or update it iff `token` >= its stored token. One
    /// statement: `INSERT .. ON CONFLICT (key) DO UPDATE SET .. WHERE
    /// t.token <= EXCLUDED.token`. The key column must be unique.
    pub async fn upsert<C: GenericClient + Sync>(
        &self,
        client: &C,
        key: (&(dyn ToSql + Sync), Type),
        token: FencingToken,
        set: &[Column<'_>],
    ) -> Result<FencedWrite> {
        let t = Self::token(token)?;
        let (names, params) = Self::params(key, &t, set);
        let sql = self.upsert_sql(&names)?;
        let rows = client
            .query_typed(&sql, &params)
            .await
            .map_err(|e| map_pg("fenced upsert", e))?;
        Ok(Self::upsert_outcome(!rows.is_empty()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_named_twice_is_refused_before_any_io() {
        let t = FencedTable::new("accounts", "id", "fence").unwrap();
        for columns in [
            &["balance", "balance"][..],
            &["balance", "note", "balance"][..],
        ] {
            for sql in [t.update_sql(columns), t.upsert_sql(columns)] {
                match sql {
                    Err(Error::InvalidArgument { .. }) => {}
                    other => panic!("{columns:?}: {other:?}"),
                }
            }
        }
        assert!(t.update_sql(&["balance", "note"]).is_ok());
    }
}
