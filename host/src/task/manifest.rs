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

/// The manifest this config and guest (built against WIT `wit_version`)
/// would write.
pub fn expected(config: &Config, guest_sha256: &str, wit_version: &str) -> Manifest {
    Manifest {
        format: FORMAT,
        store: config.store.name.clone(),
        guest: strategy(&config.store.guest),
        guest_sha256: guest_sha256.to_string(),
        wit: format!("{}@{wit_version}", crate::runtime::WIT_PACKAGE),
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
pub fn check(
    config: &Config,
    guest_sha256: &str,
    wit_version: &str,
    existing: bool,
) -> Result<Checked> {
    let dir = config.state_dir();
    let want = expected(config, guest_sha256, wit_version);
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
    // The WIT version is the guest's calling convention, not its data
    // layout (that is the strategy's, checked above): a store made by a
    // build against any version this host links opens as a new build.
    let known = crate::runtime::WIT_VERSIONS
        .iter()
        .any(|v| have.wit == format!("{}@{v}", crate::runtime::WIT_PACKAGE));
    if !known {
        bail!(
            "store `{}` in {} was made by a guest built against {}, this host links {}",
            have.store,
            dir.display(),
            have.wit,
            crate::runtime::WIT_VERSIONS
                .iter()
                .map(|v| format!("{}@{v}", crate::runtime::WIT_PACKAGE))
                .collect::<Vec<_>>()
                .join(" and ")
        );
    }
    if have.guest_sha256 != want.guest_sha256 || have.wit != want.wit {
        write(&dir, &want)?;
        return Ok(Checked::NewBuild {
            from: have.guest_sha256,
            to: want.guest_sha256,
        });
    }
    Ok(Checked::Same)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> Config {
        let text = "[store]\nguest = \"roll-back\"\nstate_dir = \"s\"\n";
        let config = Config::parse(text, "c.toml", dir).unwrap();
        std::fs::create_dir_all(config.state_dir()).unwrap();
        config
    }

    /// The WIT version is how a guest is called, not how its data is laid
    /// out: a build of the same strategy against the other linked version
    /// opens the store (recorded as a new build); an unknown one does not.
    #[test]
    fn a_store_opens_with_its_strategy_built_against_either_version() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path());
        assert_eq!(check(&c, "aa", "0.1.0", false).unwrap(), Checked::Created);
        assert_eq!(check(&c, "aa", "0.1.0", true).unwrap(), Checked::Same);
        assert!(matches!(
            check(&c, "bb", "0.2.0", true).unwrap(),
            Checked::NewBuild { .. }
        ));
        assert_eq!(
            read(&c.state_dir()).unwrap().unwrap().wit,
            "txstore:store@0.2.0"
        );
        let mut m = read(&c.state_dir()).unwrap().unwrap();
        m.wit = "txstore:store@0.9.0".into();
        write(&c.state_dir(), &m).unwrap();
        let err = check(&c, "bb", "0.2.0", true).unwrap_err().to_string();
        assert!(
            err.contains("built against txstore:store@0.9.0")
                && err.contains("links txstore:store@0.1.0 and txstore:store@0.2.0"),
            "{err}"
        );
    }
}
