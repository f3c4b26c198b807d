//! A consistent copy of an embedded store while it serves (`engram
//! backup`).
//!
//! Copying the file is not a backup: in WAL mode the newest commits live
//! in `engram.db-wal` until a checkpoint moves them, and a copy taken
//! while the server writes may hold half a transaction. SQLite's own
//! `VACUUM INTO` writes the database as one read transaction sees it to a
//! new file; a reader in WAL mode does not hold up the server's writer, so
//! the server goes on serving meanwhile. The copy is then synced and
//! checked (`PRAGMA quick_check`) before it is reported.

use std::path::Path;
use std::str::FromStr;

use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};

use crate::error::{Error, Reason, Result};

/// What a backup wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    /// The copy's size.
    pub bytes: u64,
}

/// Writes the database at `url` (`sqlite://…`, which must exist) to a new
/// file `to`, which must not exist.
pub async fn backup(url: &str, to: &Path) -> Result<Copied> {
    let refused = |message: String| Error::FailedPrecondition {
        reason: Reason::InvalidArgument,
        message,
    };
    let source = SqliteConnectOptions::from_str(url)
        .map_err(|err| refused(format!("invalid sqlite URL {url}: {err}")))?
        .create_if_missing(false)
        .read_only(true);
    if !source.get_filename().is_file() {
        return Err(refused(format!(
            "no database at {}",
            source.get_filename().display()
        )));
    }
    let target = to
        .to_str()
        .ok_or_else(|| refused(format!("{} is not a UTF-8 path", to.display())))?;
    // Made empty here, so that no other file is ever written over or
    // removed (`VACUUM INTO` fills an empty file).
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
    {
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(refused(format!(
                "{} already exists; a backup writes a new file and overwrites none",
                to.display()
            )));
        }
        Err(err) => return Err(refused(format!("cannot create {}: {err}", to.display()))),
    }
    let copied = copy(&source, target, to).await;
    if copied.is_err() {
        // Half a copy, or one that failed its check, is no backup.
        let _ = std::fs::remove_file(to);
    }
    copied
}

async fn copy(source: &SqliteConnectOptions, target: &str, to: &Path) -> Result<Copied> {
    let mut conn = SqliteConnection::connect_with(source).await?;
    sqlx::query("VACUUM INTO ?")
        .bind(target)
        .execute(&mut conn)
        .await?;
    conn.close().await?;

    // Durable before it is called a backup, and whole.
    let file = std::fs::File::open(to).map_err(Error::internal)?;
    file.sync_all().map_err(Error::internal)?;
    let bytes = file.metadata().map_err(Error::internal)?.len();
    let copy = SqliteConnectOptions::new()
        .filename(to)
        .create_if_missing(false)
        .read_only(true);
    let mut conn = SqliteConnection::connect_with(&copy).await?;
    // The search tables' own check needs the tokenizer they were made with.
    super::fts::register(&mut conn).await?;
    let check: Vec<String> = sqlx::query_scalar("PRAGMA quick_check")
        .fetch_all(&mut conn)
        .await?;
    conn.close().await?;
    if check != ["ok"] {
        return Err(Error::internal(format!(
            "the copy at {} failed its check (and is removed): {}",
            to.display(),
            check.join("; ")
        )));
    }
    Ok(Copied { bytes })
}
