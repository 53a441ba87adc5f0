//! `txstore get` and `txstore scan`: answered by the task running on the
//! store (over its query socket) when there is one, else by opening the
//! store (recovery included) and closing it again.

use super::args::{GetArgs, ScanArgs};
use super::{load_store, open, output};
use crate::task::serve;
use anyhow::{Context, Result};
use std::io::Write;

pub(super) fn get(a: GetArgs) -> Result<()> {
    let key = arg_bytes("key", &a.key, a.hex)?;
    let request = serve::Request::get(&key, a.isolation.into());
    let config = load_store(&a.config)?;
    let value = match serve::ask(&config.state_dir(), &request)? {
        Some(answer) => answer.into_value()?,
        None => {
            let (mut task, _) = open(&a.config)?;
            let value = task.get(&key, a.isolation.into())?;
            task.close()?;
            value
        }
    };
    let Some(v) = value else {
        anyhow::bail!("key {} not found", crate::tsv::escape(&key));
    };
    let mut out = std::io::stdout().lock();
    output::write_value(&mut out, a.format, &v)?;
    out.flush()?;
    Ok(())
}

pub(super) fn scan(a: ScanArgs) -> Result<()> {
    let (from, to) = (
        a.from.as_deref().map(str::as_bytes),
        a.to.as_deref().map(str::as_bytes),
    );
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut counted = 0usize;
    let shape = output::Shape {
        keys_only: a.keys_only,
    };
    // Lines go out page by page; JSON is one array, written at the end.
    let json = matches!(a.format, output::Format::Json);
    let mut held = Vec::new();
    let mut each = |mut entries: Vec<(Vec<u8>, Vec<u8>)>| -> Result<()> {
        counted += entries.len();
        if json && !a.count {
            held.append(&mut entries);
        } else if !a.count {
            output::write_entries(&mut out, a.format, shape, &entries)?;
        }
        Ok(())
    };
    let state_dir = load_store(&a.config)?.state_dir();
    let isolation = a.isolation.into();
    let live = serve::ask_scan(&state_dir, from, to, a.limit, isolation, &mut each)?;
    if !live {
        let (mut task, _) = open(&a.config)?;
        let mut failed = Ok(());
        let limit = a.limit.unwrap_or(usize::MAX);
        task.store()
            .range_pages(from, to, isolation, limit, |page| {
                if failed.is_ok() {
                    failed = each(page.to_pairs());
                }
            })?;
        failed?;
        task.close()?;
    }
    if a.count {
        writeln!(out, "{counted}")?;
    } else if json {
        output::write_entries(&mut out, a.format, shape, &held)?;
    }
    out.flush()?;
    Ok(())
}

/// A key or value from the command line: its UTF-8 bytes, or with `hex`
/// the bytes its hex digits spell.
pub(super) fn arg_bytes(what: &str, text: &str, hex: bool) -> Result<Vec<u8>> {
    if !hex {
        return Ok(text.as_bytes().to_vec());
    }
    let digits = text.as_bytes();
    anyhow::ensure!(
        digits.len() % 2 == 0,
        "the {what} `{text}` is not hex: an odd number of digits"
    );
    digits
        .chunks(2)
        .map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .with_context(|| format!("the {what} `{text}` is not hex"))
        })
        .collect()
}
