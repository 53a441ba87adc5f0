//! Store identity: a small manifest in the state directory, written when a
//! store is created, that says which guest (strategy and build), WIT
//! version, store name and changelog kind made it. Strategies lay out
//! their keyspaces differently (`buffered` keeps data in `data`,
//! `roll-back` in `main`), so opening a store with another guest would
//! find it empty or wrong and recover as if clean: that is refused with
//! one line that says what is there and what to do. A new build of the
//! same strategy opens with a note.

use crate::config::{ChangelogKind, Config};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

/// The manifest format this build writes and reads.
pub const FORMAT: u32 = 1;
pub const FILE: &str = "MANIFEST.toml";

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    /// `store.name`: the namespace of the store's keyspaces.
    pub store: String,
    /// The strategy: a built-in name, or the file stem of a `.wasm` guest.
    pub guest: String,
    /// SHA-256 of the guest component that last opened the store.
    pub guest_sha256: String,
    /// The WIT package the guest was built against.
    pub wit: String,
    /// `embedded` or `kafka`.
    pub changelog: String,
}

/// What opening found: nothing to say, a note for the operator, or a
/// manifest written for a store that had none.
#[derive(Debug, PartialEq, Eq)]
pub enum Checked {
    Same,
    Created,
    /// Same strategy, another build: opened, manifest updated.
    NewBuild {
        from: String,
        to: String,
    },
    /// A store made before manifests existed, adopted as this guest's.
    Adopted,
}

pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// The strategy name of a guest as a config names it.
pub fn strategy(guest: &str) -> String {
    match Path::new(guest).extension() {
        Some(e) if e == "wasm" => Path::new(guest)
            .file_stem()
            .map_or(guest.to_string(), |s| s.to_string_lossy().to_string()),
        _ => guest.to_string(),
    }
}

fn changelog_kind(config: &Config) -> &'static str {
    match config.changelog.kind {
        ChangelogKind::Embedded => "embedded",
        ChangelogKind::Kafka => "kafka",
    }
}

/// The manifest this config and guest would write.
pub fn expected(config: &Config, guest_sha256: &str) -> Manifest {
    Manifest {
        format: FORMAT,
        store: config.store.name.clone(),
        guest: strategy(&config.store.guest),
        guest_sha256: guest_sha256.to_string(),
        wit: format!(
            "{}@{}",
            crate::runtime::WIT_PACKAGE,
            crate::runtime::WIT_VERSION
        ),
        changelog: changelog_kind(config).to_string(),
    }
}

pub fn read(state_dir: &Path) -> Result<Option<Manifest>> {
    let p = path(state_dir);
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", p.display())),
    };
    let m: Manifest = toml::from_str(&text)
        .with_context(|| format!("store manifest {} is damaged", p.display()))?;
    if m.format != FORMAT {
        bail!(
            "store manifest {} has format {}, this txstore reads format {FORMAT} (written by a newer txstore?)",
            p.display(),
            m.format
        );
    }
    Ok(Some(m))
}

fn write(state_dir: &Path, m: &Manifest) -> Result<()> {
    write_to(&path(state_dir), m)
}

/// Writes `m` to `file` atomically and durably.
pub fn write_to(file: &Path, m: &Manifest) -> Result<()> {
    let text = toml::to_string(m).expect("manifest serializes");
    crate::file::write_atomic(file, text.as_bytes())
        .with_context(|| format!("cannot write {}", file.display()))
}

/// Checks that `config` may open the store in its state directory, before
/// anything in it changes; writes or updates the manifest. `existing` says
/// whether the directory already held a store.
pub fn check(config: &Config, guest_sha256: &str, existing: bool) -> Result<Checked> {
    let dir = config.state_dir();
    let want = expected(config, guest_sha256);
    let Some(have) = read(&dir)? else {
        write(&dir, &want)?;
        return Ok(if existing {
            Checked::Adopted
        } else {
            Checked::Created
        });
    };
    let shown = path(&dir);
    if have.store != want.store {
        bail!(
            "state directory {} holds store `{}`, not `{}` (from {}): set store.name = {:?}, or use another \
             state_dir for a new store",
            dir.display(),
            have.store,
            want.store,
            shown.display(),
            have.store
        );
    }
    if have.guest != want.guest {
        bail!(
            "store `{}` in {} was made by guest `{}`, not `{}`: strategies keep their data differently, so it \
             would open empty or wrong; set store.guest back to `{}` (to change strategy, run `txstore migrate \
             --to <guest>` with the config as it was)",
            have.store,
            dir.display(),
            have.guest,
            want.guest,
            have.guest
        );
    }
    if have.changelog != want.changelog {
        bail!(
            "store `{}` in {} was made with the {} changelog, not {}: its offsets belong to that log; set \
             changelog.kind = {:?}",
            have.store,
            dir.display(),
            have.changelog,
            want.changelog,
            have.changelog
        );
    }
    if have.wit != want.wit {
        bail!(
            "store `{}` in {} was made by a guest built against {}, this host speaks {}",
            have.store,
            dir.display(),
            have.wit,
            want.wit
        );
    }
    if have.guest_sha256 != want.guest_sha256 {
        write(&dir, &want)?;
        return Ok(Checked::NewBuild {
            from: have.guest_sha256,
            to: want.guest_sha256,
        });
    }
    Ok(Checked::Same)
}
