//! `txstore migrate`: moves a store to another strategy without losing
//! data (`task::migrate` does the work; this prints what happened and what
//! the operator sets next).

use super::args::MigrateArgs;
use super::{load_store, runtime_for};
use anyhow::Result;

pub(super) fn main(a: MigrateArgs) -> Result<()> {
    let MigrateArgs {
        config: config_path,
        to,
        options,
        json,
    } = a;
    let config = load_store(&config_path)?;
    let runtime = runtime_for(&config)?;
    let Some(r) = crate::task::migrate::migrate(&config, &runtime, &to, &options)? else {
        println!(
            "store `{}` in {} is already kept by {to} (an interrupted migration is finished); now set \
             store.guest = {to:?} in {}",
            config.store.name,
            config.state_dir().display(),
            config_path.display()
        );
        return Ok(());
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        println!(
            "migrated store `{}` from {} to {}: {} entries ({} bytes, sha256 {}..) at changelog offset {} \
             in {:.2} s",
            r.store,
            r.from,
            r.to,
            r.entries,
            r.bytes,
            &r.sha256[..16],
            r.offset,
            r.elapsed.as_secs_f64()
        );
        println!(
            "now set store.guest = {:?} in {}{}",
            to,
            config_path.display(),
            if options.is_empty() {
                String::new()
            } else {
                " (and the options given here in [store.options])".to_string()
            }
        );
    }
    Ok(())
}
