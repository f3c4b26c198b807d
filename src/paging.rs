//! AIP-158 pagination shared by every list: page sizes (0 means the default,
//! over the maximum is lowered, negative is refused) and opaque page tokens
//! that remember where the last page ended and which query it belonged to.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::error::{Error, Reason, Result};

pub const DEFAULT_PAGE_SIZE: i64 = 100;
pub const MAX_PAGE_SIZE: i64 = 1000;

/// The number of items a page holds for a requested `page_size`.
pub fn page_size(requested: i32) -> Result<i64> {
    match i64::from(requested) {
        n if n < 0 => Err(Error::invalid(
            Reason::InvalidPageSize,
            "page_size",
            format!("must not be negative, got {n}"),
        )),
        0 => Ok(DEFAULT_PAGE_SIZE),
        n => Ok(n.min(MAX_PAGE_SIZE)),
    }
}

/// A count given by a client other than a page size (a limit, a number of
/// events): 0 means `default`, over `max` is lowered, negative is refused.
pub fn bounded(field: &str, n: i32, default: i64, max: i64) -> Result<i64> {
    match i64::from(n) {
        n if n < 0 => Err(Error::invalid(
            Reason::InvalidArgument,
            field,
            format!("must not be negative, got {n}"),
        )),
        0 => Ok(default),
        n => Ok(n.min(max)),
    }
}

/// A digest of the parameters of a list call, so that a token is only
/// accepted by the query that issued it.
pub fn query_digest(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    URL_SAFE_NO_PAD.encode(&digest[..12])
}

#[derive(Serialize, serde::Deserialize)]
struct Token<C> {
    q: String,
    c: C,
}

/// Encodes the position after the last item of a page.
pub fn encode_token<C: Serialize>(query: &str, cursor: C) -> String {
    let token = Token {
        q: query.to_owned(),
        c: cursor,
    };
    // Serialising plain data to JSON cannot fail.
    let json = serde_json::to_vec(&token).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(json)
}

/// Decodes a page token issued for `query`; an empty token is the first page.
pub fn decode_token<C: DeserializeOwned>(query: &str, token: &str) -> Result<Option<C>> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = |why: &str| Error::invalid(Reason::InvalidPageToken, "page_token", why.to_owned());
    let bytes = URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad("is not a token this server issued"))?;
    let token: Token<C> =
        serde_json::from_slice(&bytes).map_err(|_| bad("is not a token this server issued"))?;
    if token.q != query {
        return Err(bad(
            "belongs to a different query; repeat the other parameters unchanged",
        ));
    }
    Ok(Some(token.c))
}

/// One page of a listing and the token for the next one.
#[derive(Debug, Clone)]
pub struct ListPage<T> {
    pub items: Vec<T>,
    /// Empty on the last page.
    pub next_page_token: String,
}

/// Cuts a page fetched with one item too many (`limit + 1`) down to
/// `limit`, and returns the token for the next page (empty when the extra
/// item was not there, i.e. this is the last page).
pub fn next_token<T>(items: &mut Vec<T>, limit: i64, token: impl Fn(&T) -> String) -> String {
    if items.len() as i64 <= limit {
        return String::new();
    }
    items.truncate(limit as usize);
    items.last().map(token).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_defaults_caps_and_refuses_negative() {
        assert_eq!(page_size(0).ok(), Some(DEFAULT_PAGE_SIZE));
        assert_eq!(page_size(7).ok(), Some(7));
        assert_eq!(page_size(5000).ok(), Some(MAX_PAGE_SIZE));
        assert_eq!(
            page_size(-1).err().map(|e| e.reason()),
            Some(Reason::InvalidPageSize)
        );
    }

    #[test]
    fn tokens_round_trip_only_for_their_query() {
        let q = query_digest(&["a", "b"]);
        let token = encode_token(&q, "k/1");
        assert_eq!(
            decode_token::<String>(&q, &token).ok().flatten().as_deref(),
            Some("k/1")
        );
        let other = query_digest(&["a", "c"]);
        assert!(decode_token::<String>(&other, &token).is_err());
        assert!(decode_token::<String>(&q, "garbage!").is_err());
        assert!(decode_token::<String>(&q, "").ok().flatten().is_none());
    }
}
