//! The one TSV field escape, for every writer of `key<TAB>value` lines
//! (`get` / `scan` in `tsv` format, the file output of a task), so that a
//! line always splits into its fields and each field reads back exactly.
//!
//! Valid UTF-8 passes through unchanged; only what a TSV line cannot
//! carry is escaped, with a backslash: `\\` (backslash), `\t`, `\n`, `\r`,
//! and `\xNN` (two lowercase hex digits) for each byte that is not part of
//! valid UTF-8. [`unescape`] undoes it.

/// One TSV field (see the module documentation).
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The bytes an [`escape`]d field stands for; `None` if it is not one.
#[cfg(any(test, feature = "testing"))]
pub fn unescape(field: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(field.len());
    let mut rest = field.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let (&e, tail) = rest.split_first()?;
        rest = tail;
        match e {
            b'\\' => out.push(b'\\'),
            b't' => out.push(b'\t'),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b'x' => {
                let hex = std::str::from_utf8(rest.get(..2)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                rest = &rest[2..];
            }
            _ => return None,
        }
    }
    Some(out)
}

/// Renders bytes in a diagnostic message: printable ASCII as is, `\\`,
/// `\t`, `\n` and everything else as `\xNN`.
pub fn escape_ascii(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        match b {
            b'\\' => s.push_str("\\\\"),
            b'\t' => s.push_str("\\t"),
            b'\n' => s.push_str("\\n"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_passes_and_the_rest_round_trips() {
        assert_eq!(escape("café naïve".as_bytes()), "café naïve");
        assert_eq!(escape(b"a\tb\\c\nd\re"), "a\\tb\\\\c\\nd\\re");
        assert_eq!(escape(&[b'k', 0xff, 0xc3]), "k\\xff\\xc3");
    }

    proptest::proptest! {
        #[test]
        fn fuzz_escape_round_trips(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            let field = escape(&bytes);
            proptest::prop_assert!(!field.contains('\t') && !field.contains('\n'));
            proptest::prop_assert_eq!(unescape(&field), Some(bytes));
        }
    }
}
