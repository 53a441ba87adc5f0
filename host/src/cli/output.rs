//! How `get` and `scan` print keys and values, so that the output can feed
//! other tools and be read back exactly.
//!
//! - `tsv` (default): one `key<TAB>value` line per entry. Valid UTF-8
//!   passes through unchanged; only what a TSV line cannot carry is
//!   escaped, with a backslash: `\\` (backslash), `\t`, `\n`, `\r`, and
//!   `\xNN` for each byte that is not part of valid UTF-8 ([`crate::tsv`],
//!   which the file output uses too; `tsv::unescape` undoes it).
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

/// The TSV field escape, shared with every other TSV writer.
pub use crate::tsv::escape;

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
