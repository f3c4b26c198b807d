//! `engram_hits(fts)`, an FTS5 auxiliary function: for the current match,
//! the size of the text column (its tokens) and how often each phrase of
//! the query occurs in that column. It is what BM25 needs of a match and
//! what FTS5's own `bm25()` reads too, but that function takes its
//! statistics (the number of rows, the average length, how many rows hold
//! each phrase) from the whole table, every tenant's rows together, so one
//! tenant's scores moved with what another tenant wrote. With these counts
//! the search ranks in Rust with statistics of the caller's own items
//! ([`super::search`]), as the Postgres store does.
//!
//! The one module with `unsafe` code: FTS5 takes auxiliary functions only
//! through the C API's `fts5_api` pointer, which sqlx does not wrap and no
//! maintained crate exposes for a connection sqlx owns. The code keeps to
//! what the API documents: it asks the connection for the pointer with
//! `SELECT fts5(?1)` and a bound pointer, registers one function, and the
//! function reads the match through `Fts5ExtensionApi` and returns a blob
//! SQLite copies. Nothing in it can panic across the C boundary (no
//! indexing, no unwrapping; a failed call answers an SQLite error code).

use std::ffi::{CStr, c_int, c_void};
use std::ptr;

use libsqlite3_sys as ffi;
use sqlx::SqliteConnection;

/// The function's SQL name, as FTS5 takes it (NUL-terminated).
const NAME: &CStr = c"engram_hits";

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
            format!("registering the FTS5 function {HITS} failed (SQLite code {rc})").into(),
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
    unsafe { create(api, NAME.as_ptr(), ptr::null_mut(), Some(hits), None) }
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

/// The function itself: the blob [`encode`] writes, or an error code.
unsafe extern "C" fn hits(
    api: *const ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
    ctx: *mut ffi::sqlite3_context,
    _count: c_int,
    _values: *mut *mut ffi::sqlite3_value,
) {
    // SAFETY: FTS5 calls this with its API and the current match.
    match unsafe { counts(api, fts) } {
        Ok((size, counts)) => {
            let blob = encode(size, &counts);
            let Ok(length) = c_int::try_from(blob.len()) else {
                // SAFETY: `ctx` is this call's context.
                unsafe { ffi::sqlite3_result_error_code(ctx, ffi::SQLITE_TOOBIG) };
                return;
            };
            // SAFETY: SQLite copies the blob (`SQLITE_TRANSIENT`) before
            // this returns and `blob` is dropped.
            unsafe {
                ffi::sqlite3_result_blob(
                    ctx,
                    blob.as_ptr().cast::<c_void>(),
                    length,
                    ffi::SQLITE_TRANSIENT(),
                )
            };
        }
        // SAFETY: as above.
        Err(rc) => unsafe { ffi::sqlite3_result_error_code(ctx, rc) },
    }
}

/// The text column's size and each phrase's occurrences in it.
///
/// # Safety
/// `api` and `fts` are what FTS5 passed to an auxiliary function.
unsafe fn counts(
    api: *const ffi::Fts5ExtensionApi,
    fts: *mut ffi::Fts5Context,
) -> Result<(u32, Vec<u32>), c_int> {
    // SAFETY: FTS5's API outlives the call.
    let api = unsafe { &*api };
    let (Some(phrase_count), Some(inst_count), Some(inst), Some(column_size)) =
        (api.xPhraseCount, api.xInstCount, api.xInst, api.xColumnSize)
    else {
        return Err(ffi::SQLITE_ERROR);
    };
    let check = |rc: c_int| {
        if rc == ffi::SQLITE_OK {
            Ok(())
        } else {
            Err(rc)
        }
    };
    // SAFETY (all four calls): the documented functions on the current
    // match, writing only through the pointers given.
    let phrases = usize::try_from(unsafe { phrase_count(fts) }).unwrap_or(0);
    let mut size: c_int = 0;
    check(unsafe { column_size(fts, 0, &mut size) })?;
    let mut instances: c_int = 0;
    check(unsafe { inst_count(fts, &mut instances) })?;
    let mut counts = vec![0u32; phrases];
    for at in 0..instances {
        let (mut phrase, mut column, mut offset) = (0, 0, 0);
        check(unsafe { inst(fts, at, &mut phrase, &mut column, &mut offset) })?;
        if column != 0 {
            continue; // the owner's tokens, not the text
        }
        if let Some(count) = usize::try_from(phrase).ok().and_then(|p| counts.get_mut(p)) {
            *count += 1;
        }
    }
    Ok((u32::try_from(size).unwrap_or(0), counts))
}

/// The blob: the text column's size, then each phrase's count, each a
/// little-endian `u32`.
fn encode(size: u32, counts: &[u32]) -> Vec<u8> {
    let mut blob = Vec::with_capacity(4 * (counts.len() + 1));
    blob.extend(size.to_le_bytes());
    for count in counts {
        blob.extend(count.to_le_bytes());
    }
    blob
}

/// Reads [`encode`]'s blob: the size and the counts, `None` when it is not
/// whole.
pub(super) fn decode(blob: &[u8]) -> Option<(u32, Vec<u32>)> {
    let mut words = blob.chunks_exact(4);
    if !words.remainder().is_empty() {
        return None;
    }
    let mut next = || {
        words
            .next()
            .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
    };
    let size = next()?;
    let mut counts = Vec::new();
    while let Some(count) = next() {
        counts.push(count);
    }
    Some((size, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_read_back_and_cut_ones_do_not() {
        let blob = encode(12, &[0, 3, 1]);
        assert_eq!(decode(&blob), Some((12, vec![0, 3, 1])));
        assert_eq!(decode(&encode(5, &[])), Some((5, vec![])));
        assert_eq!(decode(&blob[..7]), None);
        assert_eq!(decode(&[]), None);
    }
}
