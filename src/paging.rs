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

/// About how many bytes of items a page (or a list answer without pages:
/// `Recent`, `Search`) carries, however many its size allows: an answer is
/// one gRPC message, which clients and servers refuse past 4 MiB unless
/// told otherwise, and a page of large values would not fit. Weights
/// estimate the protobuf encoding, which for JSON of numbers is several
/// times the JSON's size; the margin up to 4 MiB covers the fields not
/// weighed. An answer always holds at least one item.
pub const PAGE_BYTES: usize = 2 << 20;

/// What an item of a list weighs in its answer, about, in bytes.
pub trait Weigh {
    fn weight(&self) -> usize;
}

/// An item read with its key weighs as the item.
impl<K, T: Weigh> Weigh for (K, T) {
    fn weight(&self) -> usize {
        self.1.weight()
    }
}

/// The protobuf size of a JSON value as a `google.protobuf.Value`, about:
/// a number is a tagged double, strings and keys their bytes, and each
/// value a few bytes of framing.
pub fn json_weight(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    const FRAMING: usize = 4;
    FRAMING
        + match value {
            Value::Null | Value::Bool(_) => 2,
            Value::Number(_) => 9,
            Value::String(s) => s.len(),
            Value::Array(items) => items.iter().map(json_weight).sum(),
            Value::Object(fields) => object_weight(fields),
        }
}

/// [`json_weight`] of an object's fields (a `google.protobuf.Struct`).
pub fn object_weight(fields: &serde_json::Map<String, serde_json::Value>) -> usize {
    fields
        .iter()
        .map(|(key, value)| key.len() + 4 + json_weight(value))
        .sum()
}

/// Whether items weighing `total` in all, the last of them following
/// `before` others, pass what a page carries: that last one is then cut
/// (a lone item never is).
pub fn overflows(total: usize, before: usize) -> bool {
    before > 0 && total > PAGE_BYTES
}

/// Items read one at a time up to the first that paging would cut: that
/// one is kept, for paging to cut and give a token from the one before,
/// and then the list is `full`.
pub struct Weighed<T> {
    pub items: Vec<T>,
    weight: usize,
    pub full: bool,
}

impl<T> Default for Weighed<T> {
    fn default() -> Self {
        Weighed {
            items: Vec::new(),
            weight: 0,
            full: false,
        }
    }
}

impl<T: Weigh> Weighed<T> {
    pub fn push(&mut self, item: T) {
        self.weight += item.weight();
        self.full = overflows(self.weight, self.items.len());
        self.items.push(item);
    }
}

/// Several lists sharing one answer's [`PAGE_BYTES`], cut in the order
/// they are given: each list ends at its first item that does not fit
/// what the lists before it left. Unlike a page, a list may be cut to
/// nothing.
pub struct Budget {
    left: usize,
}

impl Budget {
    /// A budget with `used` bytes already taken (by what the answer always
    /// holds).
    pub fn after(used: usize) -> Self {
        Budget {
            left: PAGE_BYTES.saturating_sub(used),
        }
    }

    /// Keeps the leading items that fit what is left.
    pub fn keep_first<T: Weigh>(&mut self, items: &mut Vec<T>) {
        let kept = self.fitting(items.iter());
        items.truncate(kept);
    }

    /// Keeps the trailing items that fit what is left (of a list oldest
    /// first, the newest).
    pub fn keep_last<T: Weigh>(&mut self, items: &mut Vec<T>) {
        let kept = self.fitting(items.iter().rev());
        items.drain(..items.len() - kept);
    }

    fn fitting<'a, T: Weigh + 'a>(&mut self, items: impl Iterator<Item = &'a T>) -> usize {
        let mut kept = 0;
        for item in items {
            match self.left.checked_sub(item.weight()) {
                Some(left) => self.left = left,
                None => break,
            }
            kept += 1;
        }
        kept
    }
}

/// Whether a read that gathered `items` one at a time up to the first
/// that paging would cut ([`Weighed`]) stopped at the last of them: then
/// more may follow although fewer than asked for came.
pub fn filled<T: Weigh>(items: &[T]) -> bool {
    let total: usize = items.iter().map(Weigh::weight).sum();
    overflows(total, items.len().saturating_sub(1))
}

/// Whether more may follow a read of up to `limit` items that stopped at
/// a page's bytes ([`Weighed`]): it came back full by count, or by bytes.
pub fn more<T: Weigh>(items: &[T], limit: i64) -> bool {
    i64::try_from(items.len()).is_ok_and(|n| n >= limit) || filled(items)
}

/// How many leading items fit in [`PAGE_BYTES`]: at least one.
pub fn fitting<T: Weigh>(items: &[T]) -> usize {
    let mut total = 0;
    for (n, item) in items.iter().enumerate() {
        total += item.weight();
        if overflows(total, n) {
            return n;
        }
    }
    items.len()
}

/// Cuts a page fetched with one item too many (`limit + 1`) down to
/// `limit`, and further to what fits in [`PAGE_BYTES`], and returns the
/// token for the next page (empty when nothing was cut, i.e. this is the
/// last page).
pub fn next_token<T: Weigh>(
    items: &mut Vec<T>,
    limit: i64,
    token: impl Fn(&T) -> String,
) -> String {
    let more = items.len() as i64 > limit;
    items.truncate(limit.max(0) as usize);
    let fit = fitting(items);
    let cut = fit < items.len();
    items.truncate(fit);
    if !(more || cut) {
        return String::new();
    }
    items.last().map(token).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Weighing(usize);

    impl Weigh for Weighing {
        fn weight(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn pages_end_where_their_bytes_would_not_fit() {
        let page = |weights: &[usize], limit: i64| {
            let mut items: Vec<Weighing> = weights.iter().map(|w| Weighing(*w)).collect();
            let token = next_token(&mut items, limit, |last| last.0.to_string());
            (items.iter().map(|i| i.0).collect::<Vec<_>>(), token)
        };
        let half = PAGE_BYTES / 2;
        // Within the limit and the bytes: the last page.
        assert_eq!(page(&[1, 2], 2), (vec![1, 2], String::new()));
        // The extra item is there: more.
        assert_eq!(page(&[1, 2, 3], 2), (vec![1, 2], "2".to_owned()));
        // Cut by bytes: a token from the last item kept.
        assert_eq!(
            page(&[half, half, 7], 5),
            (vec![half, half], half.to_string())
        );
        assert_eq!(
            page(&[half, half + 1, 7], 5),
            (vec![half], half.to_string())
        );
        // One item too big for a page still goes alone.
        assert_eq!(
            page(&[3 * PAGE_BYTES, 1], 5),
            (vec![3 * PAGE_BYTES], (3 * PAGE_BYTES).to_string())
        );
    }

    #[test]
    fn weighed_reads_stop_at_the_item_a_page_cuts() {
        let read = |weights: &[usize]| {
            let mut read = Weighed::default();
            for w in weights {
                read.push(Weighing(*w));
                if read.full {
                    break;
                }
            }
            let mut items = read.items;
            let kept = fitting(&items);
            let cut = items.len() - kept;
            items.truncate(kept);
            (items.iter().map(|i| i.0).collect::<Vec<_>>(), cut)
        };
        let half = PAGE_BYTES / 2;
        // Everything fits: all read, none cut.
        assert_eq!(read(&[1, 2, 3]), (vec![1, 2, 3], 0));
        // Read up to the one that does not fit, which paging then cuts.
        assert_eq!(read(&[half, half, 1, 9]), (vec![half, half], 1));
        // A lone item too big is read, and kept.
        assert_eq!(read(&[3 * PAGE_BYTES, 1]), (vec![3 * PAGE_BYTES], 1));
        // What such a read stopped at is known from the items alone.
        let filled =
            |weights: &[usize]| filled(&weights.iter().map(|w| Weighing(*w)).collect::<Vec<_>>());
        assert!(filled(&[half, half, 1]));
        assert!(!filled(&[half, half]));
        assert!(!filled(&[3 * PAGE_BYTES]));
        assert!(!filled(&[]));
        let more = |weights: &[usize], limit| {
            more(
                &weights.iter().map(|w| Weighing(*w)).collect::<Vec<_>>(),
                limit,
            )
        };
        assert!(more(&[1, 2], 2) && more(&[half, half, 1], 5));
        assert!(!more(&[1], 2) && !more(&[], 1));
    }

    #[test]
    fn a_budget_keeps_lists_in_order_until_it_is_spent() {
        let weights = |items: &[Weighing]| items.iter().map(|i| i.0).collect::<Vec<_>>();
        let third = PAGE_BYTES / 3;
        let mut budget = Budget::after(third);
        let mut first = vec![Weighing(third), Weighing(1)];
        budget.keep_first(&mut first);
        assert_eq!(weights(&first), [third, 1]);
        // Oldest first: the newest that fit are kept.
        let mut second = vec![Weighing(5), Weighing(third), Weighing(third)];
        budget.keep_last(&mut second);
        assert_eq!(weights(&second), [third]);
        // A list ends at its first item that does not fit; the next list
        // may still have what is left (here, a byte or two).
        let left = PAGE_BYTES - 3 * third - 1;
        let mut third_list = vec![Weighing(left + 1), Weighing(1)];
        budget.keep_first(&mut third_list);
        assert!(third_list.is_empty());
        let mut fourth = vec![Weighing(left), Weighing(1)];
        budget.keep_first(&mut fourth);
        assert_eq!(weights(&fourth), [left]);
        let mut spent = Budget::after(2 * PAGE_BYTES);
        let mut none = vec![Weighing(1)];
        spent.keep_last(&mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn json_weighs_numbers_as_doubles() {
        let numbers = serde_json::json!([1, 2, 3]);
        let text = serde_json::json!("abc");
        assert!(json_weight(&numbers) > numbers.to_string().len() * 3);
        assert_eq!(json_weight(&text), 4 + 3);
    }

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
