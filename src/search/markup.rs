//! Markup as Postgres's default text search parser reads it, so that
//! SQLite's tokenizer leaves out what Postgres leaves out: HTML and XML
//! tags (`<div class="x">`, `</p>`, `<br/>`, `<!-- … -->`, `<!DOCTYPE …>`,
//! `<?xml …?>`), entities (`&amp;`, `&#169;`, `&#x41;`) and the bodies of
//! `script` and `style` elements. None of it is indexed by the `english`
//! configuration, so a search for `div`, `href` or `nbsp` finds an
//! episode holding a web page on neither store.
//!
//! Postgres's parser is a state machine in C (`wparser_def.c`) that no
//! crate reproduces; [`hidden`] follows it for these token types, as read
//! from Postgres 15's `ts_debug`, and a test compares the two on a corpus
//! of cases against a live server. It reads the text as Postgres's
//! indexes do, after [`super::english::spaced`] (which keeps every byte
//! where it was, so the ranges hold for the original text too; see
//! [`in_text`]).

use std::borrow::Cow;
use std::ops::Range;

use super::english::spaced;

/// The byte ranges of `text` that Postgres's parser reads as markup: tags,
/// entities, and what lies between a `<script>` or `<style>` tag and the
/// next `</script>` or `</style>` (to the end when none follows; as the
/// parser does, a name followed by `>` or a space switches even when the
/// rest of its tag does not parse). In order, not overlapping.
pub fn hidden(text: &str) -> Vec<Range<usize>> {
    let bytes = text.as_bytes();
    let mut ranges: Vec<Range<usize>> = Vec::new();
    // Where the body of a script or style element began.
    let mut ignoring: Option<usize> = None;
    let mut at = 0;
    while at < bytes.len() {
        let (end, special) = match bytes[at] {
            b'<' => tag(text, at),
            b'&' if ignoring.is_none() => (entity(text, at), Special::None),
            _ => (None, Special::None),
        };
        // The parser switches its reading on a `script` or `style` name as
        // soon as the name ends, even where the tag then fails to parse.
        match (special, ignoring) {
            (Special::Opens, None) => ignoring = Some(at),
            (Special::Closes, Some(from)) => {
                push(&mut ranges, from..end.unwrap_or(at));
                ignoring = None;
                at = end.unwrap_or(at + 1);
                continue;
            }
            _ => {}
        }
        match end {
            Some(end) => {
                if ignoring.is_none() {
                    push(&mut ranges, at..end);
                }
                at = end;
            }
            None => at += 1,
        }
    }
    if let Some(from) = ignoring {
        push(&mut ranges, from..bytes.len());
    }
    ranges
}

/// [`hidden`] of a text as Postgres's indexes read it (after `spaced`),
/// at once empty for text with neither `<` nor `&`, where no markup
/// starts: what SQLite's tokenizer and [`visible`] ask.
pub fn in_text(text: &str) -> Vec<Range<usize>> {
    if !text.contains(['<', '&']) {
        return Vec::new();
    }
    hidden(&spaced(text))
}

/// `text` with each of `hidden`'s ranges (as [`in_text`] gives them) in
/// spaces, byte for byte, so that every other byte keeps its offset: what
/// stands beside markup is then read as beside a blank, as Postgres's
/// parser ends a word at a tag or an entity (`3.14` in `<td>3.14</td>` is
/// one number there). A range that does not fall on character boundaries
/// is left as it is.
pub fn blanked<'a>(text: &'a str, hidden: &[Range<usize>]) -> Cow<'a, str> {
    if hidden.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for range in hidden {
        let (Some(before), Some(_)) = (text.get(at..range.start), text.get(range.clone())) else {
            continue;
        };
        out.push_str(before);
        out.extend(std::iter::repeat_n(' ', range.len()));
        at = range.end;
    }
    out.push_str(text.get(at..).unwrap_or_default());
    Cow::Owned(out)
}

/// `text` as a reader sees it, for snippets: each stretch of markup one
/// space (none beside whitespace), but an entity alone the character it
/// names (`&amp;` → `&`, `&#169;` → `©`, `&eacute;` → `é`, `&nbsp;` a
/// space).
pub fn visible(text: &str) -> Cow<'_, str> {
    let hidden = in_text(text);
    if hidden.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for range in hidden {
        out.push_str(text.get(at..range.start).unwrap_or_default());
        let markup = text.get(range.clone()).unwrap_or_default();
        match named(markup) {
            Some(named) if !named.chars().all(|c| c.is_whitespace() || c.is_control()) => {
                out.push_str(&named)
            }
            _ => {
                let before = out.chars().next_back().is_none_or(char::is_whitespace);
                let after = text
                    .get(range.end..)
                    .and_then(|rest| rest.chars().next())
                    .is_none_or(char::is_whitespace);
                if !before && !after {
                    out.push(' ');
                }
            }
        }
        at = range.end;
    }
    out.push_str(text.get(at..).unwrap_or_default());
    Cow::Owned(out)
}

/// The text an entity names (`&eacute;` → `é`, `&#169;` → `©`): a number,
/// or any name of HTML5's table (through `html_escape`, which holds it
/// whole); `None` for a name it lacks or a number that names no
/// character.
fn named(entity: &str) -> Option<Cow<'_, str>> {
    match html_escape::decode_html_entities(entity) {
        Cow::Owned(text) if text != entity => Some(Cow::Owned(text)),
        _ => None,
    }
}

/// Adds a range unless it is empty (each tag and entity a range of its
/// own, so that [`visible`] can read an entity beside a tag).
fn push(ranges: &mut Vec<Range<usize>>, range: Range<usize>) {
    if !range.is_empty() {
        ranges.push(range);
    }
}

/// What a tag does to the parser's reading of what follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Special {
    None,
    /// `<script …>` or `<style …>`: what follows is not read.
    Opens,
    /// `</script …>` or `</style …>`: reading resumes.
    Closes,
}

/// Whitespace as the parser's `isspace` sees it.
fn is_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// The character at `at`, if any.
fn char_at(text: &str, at: usize) -> Option<char> {
    text.get(at..).and_then(|rest| rest.chars().next())
}

/// The end of the tag that starts at `at` (a `<`), `None` when the parser
/// would not read a tag there; and what the tag's name does to the
/// reading of what follows, which holds even when the tag then fails.
fn tag(text: &str, at: usize) -> (Option<usize>, Special) {
    let bytes = text.as_bytes();
    let mut i = at + 1;
    let closing = match bytes.get(i) {
        Some(b'!') => {
            let end = match (bytes.get(i + 1), bytes.get(i + 2)) {
                // A comment, to the first `-->` after its opening.
                (Some(b'-'), Some(b'-')) => text
                    .get(i + 3..)
                    .and_then(|rest| rest.find("-->"))
                    .map(|end| i + 3 + end + 3),
                (Some(b'd' | b'D'), _) => attributes(text, i + 2),
                _ => None,
            };
            return (end, Special::None);
        }
        // `<?x…`: what the parser takes for `<?xml`.
        Some(b'?') => {
            let end = match bytes.get(i + 1) {
                Some(b'x') => attributes(text, i + 2),
                _ => None,
            };
            return (end, Special::None);
        }
        Some(b'/') => {
            i += 1;
            if !bytes.get(i).is_some_and(u8::is_ascii_alphabetic) {
                return (None, Special::None);
            }
            true
        }
        Some(b) if b.is_ascii_alphabetic() || matches!(b, b'_' | b':') => false,
        _ => return (None, Special::None),
    };
    // The name: letters (any script), digits and `:-._`.
    let name_start = i;
    while let Some(c) = char_at(text, i) {
        if c.is_alphanumeric() || matches!(c, ':' | '-' | '.' | '_') {
            i += c.len_utf8();
        } else {
            break;
        }
    }
    let name = text.get(name_start..i).unwrap_or_default();
    let special = match (
        ["script", "style"]
            .iter()
            .any(|s| name.eq_ignore_ascii_case(s)),
        closing,
    ) {
        (false, _) => Special::None,
        (true, false) => Special::Opens,
        (true, true) => Special::Closes,
    };
    match bytes.get(i) {
        // `<br/>`: the name ends the tag, which switches nothing.
        Some(b'/') => (
            (bytes.get(i + 1) == Some(&b'>')).then_some(i + 2),
            Special::None,
        ),
        Some(b'>') => (Some(i + 1), special),
        Some(&b) if is_space(b) => (attributes(text, i + 1), special),
        _ => (None, Special::None),
    }
}

/// The end of a tag whose attributes start at `at`: after the `>` that
/// closes it, with quoted values (`'…'`, `"…"`, a backslash escaping the
/// next character) read whole. `None` when a character the parser does
/// not take in a tag comes first.
fn attributes(text: &str, at: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut i = at;
    loop {
        match *bytes.get(i)? {
            b'>' => return Some(i + 1),
            quote @ (b'\'' | b'"') => {
                i += 1;
                loop {
                    match *bytes.get(i)? {
                        b'\\' => i += 2,
                        b if b == quote => break,
                        _ => i += 1,
                    }
                }
                i += 1;
            }
            b if b.is_ascii_alphanumeric() || is_space(b) || b"=-_#/:.&?%~".contains(&b) => {
                i += 1;
            }
            _ => return None,
        }
    }
}

/// The end of the entity that starts at `at` (a `&`): `&name;` (a name of
/// letters of any script, digits and `-._:`, starting with an ASCII
/// letter, `_` or `:`), `&#digits;` or `&#xhex;`.
fn entity(text: &str, at: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut i = at + 1;
    match *bytes.get(i)? {
        b'#' => {
            i += 1;
            let hex = matches!(bytes.get(i), Some(b'x' | b'X'));
            if hex {
                i += 1;
            }
            let digits = i;
            while bytes.get(i).is_some_and(|b| {
                if hex {
                    b.is_ascii_hexdigit()
                } else {
                    b.is_ascii_digit()
                }
            }) {
                i += 1;
            }
            (i > digits && bytes.get(i) == Some(&b';')).then_some(i + 1)
        }
        b if b.is_ascii_alphabetic() || matches!(b, b'_' | b':') => {
            i += 1;
            while let Some(c) = char_at(text, i) {
                if c.is_alphanumeric() || matches!(c, '-' | '.' | '_' | ':') {
                    i += c.len_utf8();
                } else {
                    break;
                }
            }
            (bytes.get(i) == Some(&b';')).then_some(i + 1)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The markup of `text`, as the strings the ranges hold.
    fn markup(text: &str) -> Vec<&str> {
        hidden(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn markup_is_blanked_byte_for_byte() {
        let text = "<td>3.14</td> &lt;é&gt; plain";
        let blanked = blanked(text, &in_text(text));
        assert_eq!(
            blanked,
            format!(
                "{}3.14{}é{}plain",
                " ".repeat(4),
                " ".repeat(10),
                " ".repeat(5)
            )
        );
        assert_eq!(blanked.len(), text.len());
        assert!(matches!(super::blanked("plain", &[]), Cow::Borrowed(_)));
        // A range off a character's boundary is left alone.
        assert_eq!(super::blanked("é<b>x", &[1..2, 2..5]), "é   x");
    }

    #[test]
    fn tags_entities_and_script_bodies_as_postgres_reads_them() {
        // Each case as Postgres 15's `ts_debug('english', …)` reads it.
        let cases: &[(&str, &[&str])] = &[
            (
                "<div class=\"x\">deploy</div> after",
                &["<div class=\"x\">", "</div>"],
            ),
            (
                "a<b c>d &#169; x&y; <br/>",
                &["<b c>", "&#169;", "&y;", "<br/>"],
            ),
            ("1<2 and 3>4 <1> < a>", &[]),
            (
                "<a b=\"x>y\">z <a b='x\\'y'>z",
                &["<a b=\"x>y\">", "<a b='x\\'y'>"],
            ),
            ("<a b=(c)>z <a b=x,y>z <a b=!x>z <a é=\"x\">z", &[]),
            (
                "<a b=x~y>z <a b=c&d>z <a b=#x>z",
                &["<a b=x~y>", "<a b=c&d>", "<a b=#x>"],
            ),
            ("<a<b>z </ div>z </_a>z <a/ >z", &["<b>"]),
            (
                "<!DOCTYPE html>z <?xml version=\"1.0\"?>z <!a>z <?a>z",
                &["<!DOCTYPE html>", "<?xml version=\"1.0\"?>"],
            ),
            (
                "<!-- a <b> -- c -->z <!---->z <!-->z",
                &["<!-- a <b> -- c -->", "<!---->"],
            ),
            (
                "<aé>z <a-1.b:c_d>z <a/b>z </a/>z",
                &["<aé>", "<a-1.b:c_d>", "</a/>"],
            ),
            (
                "&amp;x &#x41;y &#65;y &a1;y &1;y &aé;y &é;y &#12a;y &a b;z",
                &["&amp;", "&#x41;", "&#65;", "&a1;", "&aé;"],
            ),
            (
                "&a-b;z &a.b;z &a:b;z &_a;z &a!b;z &&amp;z &amp",
                &["&a-b;", "&a.b;", "&a:b;", "&_a;", "&amp;"],
            ),
            (
                "<script>var x = deploy;</script> after",
                &["<script>var x = deploy;</script>"],
            ),
            (
                "<SCRIPT>x</Style> y <scripts>z</scripts>",
                &["<SCRIPT>x</Style>", "<scripts>", "</scripts>"],
            ),
            (
                "<style >p {x} <b>y</b></style > z <script/>w",
                &["<style >p {x} <b>y</b></style >", "<script/>"],
            ),
            (
                "<script type=\"a\">never closed &amp; gone",
                &["<script type=\"a\">never closed &amp; gone"],
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(markup(text), *expected, "{text}");
        }
    }

    #[test]
    fn a_reader_sees_the_text_without_its_markup() {
        for (text, seen) in [
            (
                "<p>Read <a href=\"https://x.io/a.html\">the guide</a>&nbsp;first.</p>",
                "Read the guide first.",
            ),
            (
                "Fish &amp; chips &#169; &#x41;&unknown;B",
                "Fish & chips © A B",
            ),
            // Any name of HTML5's table.
            (
                "caf&eacute; &ldquo;ok&rdquo; it&rsquo;s &Zcaron;i&zcaron;ek x&#1;y",
                "café “ok” it’s Žižek x y",
            ),
            ("<style>p {}</style>Title<br/>line", "Title line"),
            ("no markup: a < b & c", "no markup: a < b & c"),
        ] {
            assert_eq!(visible(text), seen, "{text}");
        }
        assert!(matches!(visible("plain"), Cow::Borrowed(_)));
    }

    #[test]
    fn odd_input_ends_cleanly() {
        for text in [
            "<",
            "&",
            "<a",
            "<a b=\"",
            "<a b=\"\\",
            "&#",
            "&#x",
            "<!--",
            "<!",
            "<?",
            "</",
            "<a/",
            "é<é>&é;",
        ] {
            let ranges = hidden(text);
            assert!(ranges.iter().all(|r| r.end <= text.len()), "{text}");
        }
    }
}
