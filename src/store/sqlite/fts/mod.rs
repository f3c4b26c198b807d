//! The FTS5 extensions the SQLite store registers on each connection it
//! opens: `engram_hits`, the auxiliary function a search reads each match's
//! counts through ([`hits`]), and `engram_english`, the tokenizer of the
//! search tables ([`tokenizer`]), which reads text as the table's `reading`
//! argument says ([`reading`]).
//!
//! The one module with `unsafe` code: FTS5 takes auxiliary functions and
//! tokenizers only through the C API's `fts5_api` pointer, which sqlx does
//! not wrap and no maintained crate exposes for a connection sqlx owns.
//! The code keeps to what the API documents: it asks the connection for
//! the pointer with `SELECT fts5(?1)` and a bound pointer, registers one
//! function and one tokenizer; the function reads the match through
//! `Fts5ExtensionApi` and returns a blob SQLite copies, and the tokenizer
//! wraps an instance of `unicode61` (found with `xFindTokenizer`, as
//! FTS5's `porter` wraps its parent) and hands each of its tokens on,
//! stemmed. Nothing in it can panic across the C boundary (no indexing,
//! no unwrapping, the stemmer called under `catch_unwind`; a failed call
//! answers an SQLite error code).

mod hits;
mod reading;
mod tokenizer;

use std::ffi::{CStr, c_int, c_void};
use std::ptr;

use libsqlite3_sys as ffi;
use sqlx::SqliteConnection;

pub(super) use hits::decode;

/// The function's SQL name, as FTS5 takes it (NUL-terminated).
const NAME: &CStr = c"engram_hits";

/// The tokenizer's name, as FTS5 takes it.
const TOKENIZER: &CStr = c"engram_english";

/// The tokenizer it wraps.
pub(super) const PARENT: &CStr = c"unicode61";

/// The function's SQL name, for statements.
pub(super) const HITS: &str = match NAME.to_str() {
    Ok(name) => name,
    Err(_) => panic!("the name is ASCII"),
};

/// Registers [`HITS`] on a connection (each connection of a pool, when it
/// opens).
pub(super) async fn register(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: `db` is the connection's open handle, and the lock held on it
    // keeps sqlx's worker from using it meanwhile.
    let rc = unsafe { register_on(db) };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(sqlx::Error::Configuration(
            format!("registering the FTS5 function {HITS} and tokenizer engram_english failed (SQLite code {rc})").into(),
        ))
    }
}

/// # Safety
/// `db` is an open connection no other thread uses during the call.
unsafe fn register_on(db: *mut ffi::sqlite3) -> c_int {
    // SAFETY: as the caller promises.
    let api = match unsafe { fts5_api(db) } {
        Ok(api) => api,
        Err(rc) => return rc,
    };
    // SAFETY: `api` is the connection's FTS5 API, valid while it is open.
    let Some(create) = (unsafe { (*api).xCreateFunction }) else {
        return ffi::SQLITE_ERROR;
    };
    // SAFETY: the name is NUL-terminated and copied by FTS5; the function
    // has the documented signature and needs no user data.
    let rc = unsafe { create(api, NAME.as_ptr(), ptr::null_mut(), Some(hits::hits), None) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    // SAFETY: `api` as above.
    let Some(create_tokenizer) = (unsafe { (*api).xCreateTokenizer }) else {
        return ffi::SQLITE_ERROR;
    };
    let mut methods = ffi::fts5_tokenizer {
        xCreate: Some(tokenizer::create),
        xDelete: Some(tokenizer::delete),
        xTokenize: Some(tokenizer::tokenize),
    };
    // SAFETY: FTS5 copies the name and the methods; the user data is the
    // connection's own `fts5_api`, which lives as long as the tokenizer
    // can be used, and needs no destructor.
    unsafe {
        create_tokenizer(
            api,
            TOKENIZER.as_ptr(),
            api.cast::<c_void>(),
            &mut methods,
            None,
        )
    }
}

/// The connection's `fts5_api` pointer, as FTS5 documents getting it.
///
/// # Safety
/// As [`register_on`].
unsafe fn fts5_api(db: *mut ffi::sqlite3) -> Result<*mut ffi::fts5_api, c_int> {
    let mut stmt: *mut ffi::sqlite3_stmt = ptr::null_mut();
    // SAFETY: a NUL-terminated statement text on an open connection.
    let rc = unsafe {
        ffi::sqlite3_prepare_v2(
            db,
            c"SELECT fts5(?1)".as_ptr(),
            -1,
            &mut stmt,
            ptr::null_mut(),
        )
    };
    if rc != ffi::SQLITE_OK {
        return Err(rc);
    }
    let mut api: *mut ffi::fts5_api = ptr::null_mut();
    // SAFETY: FTS5 writes its API pointer through the bound pointer during
    // the step; `api` outlives the statement, which is finalized here.
    let rc = unsafe {
        ffi::sqlite3_bind_pointer(
            stmt,
            1,
            (&mut api as *mut *mut ffi::fts5_api).cast::<c_void>(),
            c"fts5_api_ptr".as_ptr(),
            None,
        );
        ffi::sqlite3_step(stmt);
        ffi::sqlite3_finalize(stmt)
    };
    if rc != ffi::SQLITE_OK {
        return Err(rc);
    }
    if api.is_null() {
        return Err(ffi::SQLITE_ERROR);
    }
    Ok(api)
}

#[cfg(test)]
mod tests;
