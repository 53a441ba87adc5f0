//! How `get` and `scan` print keys and values, so that the output can feed
//! other tools and be read back exactly.
//!
//! - `tsv` (default): one `key<TAB>value` line per entry. Valid UTF-8
//!   passes through unchanged; only what a TSV line cannot carry is
//!   escaped, with a backslash: `\\` (backslash), `\t`, `\n`, `\r`, and
//!   `\xNN` for each byte that is not part of valid UTF-8. [`unescape`]
//!   undoes it.
//! - `json`: an array of objects; a key or value that is valid UTF-8 is a
//!   JSON string under `key` / `value`, any other is standard base64
//!   (RFC 4648, padded) under `key_base64` / `value_base64`.
//! - `raw`: the bytes as stored, key TAB value NEWLINE (for `get`, the
//!   value alone, no newline): exact, but ambiguous if they hold tabs or
//!   newlines.
//! - `hex`: lowercase hex of key and value, TAB separated.

use base64::Engine as _;
use std::io::Write;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Tsv,
    Json,
    Raw,
    Hex,
}

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
#[cfg(test)]
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

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key or value as a JSON member: a string if it is UTF-8, else base64.
fn json_member(obj: &mut serde_json::Map<String, serde_json::Value>, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => obj.insert(name.into(), s.into()),
        Err(_) => obj.insert(
            format!("{name}_base64"),
            base64::engine::general_purpose::STANDARD
                .encode(bytes)
                .into(),
        ),
    };
}

/// What `scan` prints of each entry.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shape {
    pub keys_only: bool,
}

/// Writes entries in `format`. A closed pipe surfaces as an
/// `io::ErrorKind::BrokenPipe` error, which the caller ends quietly on.
pub fn write_entries(
    out: &mut impl Write,
    format: Format,
    shape: Shape,
    entries: &[(Vec<u8>, Vec<u8>)],
) -> std::io::Result<()> {
    match format {
        Format::Json => {
            let rows: Vec<serde_json::Value> = entries
                .iter()
                .map(|(k, v)| {
                    let mut obj = serde_json::Map::new();
                    json_member(&mut obj, "key", k);
                    if !shape.keys_only {
                        json_member(&mut obj, "value", v);
                    }
                    serde_json::Value::Object(obj)
                })
                .collect();
            serde_json::to_writer_pretty(&mut *out, &rows)?;
            writeln!(out)
        }
        Format::Tsv | Format::Raw | Format::Hex => {
            for (k, v) in entries {
                let (k, v) = match format {
                    Format::Tsv => (escape(k).into_bytes(), escape(v).into_bytes()),
                    Format::Hex => (hex(k).into_bytes(), hex(v).into_bytes()),
                    _ => (k.clone(), v.clone()),
                };
                out.write_all(&k)?;
                if !shape.keys_only {
                    out.write_all(b"\t")?;
                    out.write_all(&v)?;
                }
                out.write_all(b"\n")?;
            }
            Ok(())
        }
    }
}

/// Writes one value as `get` prints it.
pub fn write_value(out: &mut impl Write, format: Format, value: &[u8]) -> std::io::Result<()> {
    match format {
        Format::Tsv => writeln!(out, "{}", escape(value)),
        Format::Hex => writeln!(out, "{}", hex(value)),
        Format::Raw => out.write_all(value),
        Format::Json => {
            let mut obj = serde_json::Map::new();
            json_member(&mut obj, "value", value);
            serde_json::to_writer(&mut *out, &obj)?;
            writeln!(out)
        }
    }
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
