//! The two SQL dialects: placeholders rewritten for PostgreSQL, and the test builds' switch
//! that drops the tenant filter.

use std::borrow::Cow;

use keel_core::mechanisms::Mechanism;

/// Which SQL dialect a store speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite 3.35+ (RETURNING, ON CONFLICT).
    Sqlite,
    /// PostgreSQL 12+.
    Postgres,
}

/// Test builds with `tenant_scope` turned off (`keel_core::mechanisms`): every `…tenant_id = ?`
/// condition of `sql` made `(…tenant_id = ? OR 1 = 1)` (same placeholders, always true), so the
/// store's tenant filter is gone from every query that goes through [`Dialect::sql`].
fn unscoped(sql: &str) -> String {
    const NEEDLE: &str = "tenant_id = ?";
    let mut out = String::with_capacity(sql.len() + 32);
    let mut rest = sql;
    while let Some(at) = rest.find(NEEDLE) {
        // The qualified column starts after the last character that cannot be part of it.
        let start = rest[..at]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .map_or(0, |i| i + 1);
        out.push_str(&rest[..start]);
        out.push('(');
        out.push_str(&rest[start..at + NEEDLE.len()]);
        out.push_str(" OR 1 = 1)");
        rest = &rest[at + NEEDLE.len()..];
    }
    out.push_str(rest);
    out
}

impl Dialect {
    /// Rewrites `?` placeholders for this dialect (`$1, $2, …` for PostgreSQL). The SQL in this
    /// crate has no `?` inside literals.
    pub(crate) fn sql(self, sql: &str) -> Cow<'_, str> {
        let sql: Cow<'_, str> = if keel_core::mechanisms::is_off(Mechanism::TenantScope) {
            Cow::Owned(unscoped(sql))
        } else {
            Cow::Borrowed(sql)
        };
        match self {
            Dialect::Sqlite => sql,
            Dialect::Postgres => {
                let mut out = String::with_capacity(sql.len() + 16);
                let mut n = 0;
                for ch in sql.chars() {
                    if ch == '?' {
                        n += 1;
                        out.push('$');
                        out.push_str(&n.to_string());
                    } else {
                        out.push(ch);
                    }
                }
                Cow::Owned(out)
            }
        }
    }

    pub(super) fn blob_type(self) -> &'static str {
        match self {
            Dialect::Sqlite => "BLOB",
            Dialect::Postgres => "BYTEA",
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
        }
    }
}
