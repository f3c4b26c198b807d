//! `engram_hits(fts)`, an FTS5 auxiliary function: for the current match,
//! the size of the text column (its tokens) and how often each phrase of
//! the query occurs in that column. It is what BM25 needs of a match and
//! what FTS5's own `bm25()` reads too, but that function takes its
//! statistics (the number of rows, the average length, how many rows hold
//! each phrase) from the whole table, every tenant's rows together, so one
//! tenant's scores moved with what another tenant wrote. With these counts
//! the search ranks in Rust with statistics of the caller's own items
//! ([`super::super::search`]), as the Postgres store does.

use std::ffi::{c_int, c_void};

use libsqlite3_sys as ffi;

/// The function itself: the blob [`encode`] writes, or an error code.
pub(super) unsafe extern "C" fn hits(
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
pub(in crate::store::sqlite) fn decode(blob: &[u8]) -> Option<(u32, Vec<u32>)> {
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
