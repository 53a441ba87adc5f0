//! `txstore inspect`: a guest's (or processor's) world, version, claims
//! and hash, without a store.

use crate::runtime::{self, GuestSource, Runtime};
use anyhow::Result;
use std::path::Path;

pub(super) fn main(guest: &str) -> Result<()> {
    let runtime = Runtime::new(crate::config::default_cache_dir())?;
    let source = GuestSource::parse(guest);
    let component = match (runtime.load(&source), &source) {
        (Ok(c), _) => c,
        (Err(e), GuestSource::Path(path))
            if format!("{e:#}").contains("it is a processor component") =>
        {
            return inspect_processor(&runtime, path);
        }
        (Err(e), _) => return Err(e),
    };
    let backend = crate::storage::MemoryBackend::new();
    let storage = crate::storage::Backend::open_store(&backend, "inspect")?;
    let mut instance = component.instantiate(storage, "inspect", &runtime::Limits::default())?;
    let transactional = instance.transactional()?;
    if component.is_native() {
        // No component: nothing was compiled, hashed or linked.
        println!("guest:          {source} (built into the host, not a component: wipe-on-crash in Rust, no sandbox)");
        println!("transactional:  {transactional}");
        return Ok(());
    }
    println!("guest:          {source}");
    println!(
        "world:          {}/store@{}",
        runtime::WIT_PACKAGE,
        component.version
    );
    println!("transactional:  {transactional}");
    println!("exports:        {}", component.exports.join(", "));
    println!("imports:        {}", component.imports.join(", "));
    println!("sha256:         {}", component.load.hash);
    println!(
        "load:           {:.1} ms ({})",
        component.load.elapsed.as_secs_f64() * 1e3,
        if component.load.cached {
            "cached compilation"
        } else {
            "compiled"
        }
    );
    Ok(())
}

/// `txstore inspect` of a processor component (the `processor` world).
fn inspect_processor(runtime: &Runtime, path: &Path) -> Result<()> {
    let component = crate::task::wasm_processor::ProcessorComponent::load(runtime, path)?;
    println!("processor:      {}", path.display());
    println!(
        "world:          {}/processor@{}",
        runtime::WIT_PACKAGE,
        component.version
    );
    println!("exports:        {}", component.exports.join(", "));
    println!("imports:        {}", component.imports.join(", "));
    println!("sha256:         {}", component.load.hash);
    Ok(())
}
