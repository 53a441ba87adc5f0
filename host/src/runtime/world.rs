//! Which world of wit/ a component implements and at which version, and
//! the one-line errors when it implements neither or imports what the
//! host does not provide.

use super::{WIT_PACKAGE, WIT_VERSIONS};
use anyhow::{bail, Result};
use wasmtime::component::Component;
use wasmtime::Engine;

/// Refuses core modules and other files before wasmtime gives a less
/// direct error.
pub(super) fn check_is_component(label: &str, bytes: &[u8]) -> Result<()> {
    if bytes.len() < 8 || &bytes[0..4] != b"\0asm" {
        bail!("guest {label} is not a WebAssembly file (no `\\0asm` header)");
    }
    // Bytes 4..8: version and layer; layer 1 is a component.
    if bytes[6..8] != [1, 0] {
        bail!(
            "guest {label} is a core WebAssembly module, not a component: build it for wasm32-wasip2 \
             (or wrap it with `wasm-tools component new`)"
        );
    }
    Ok(())
}

/// What the linker offers a guest, for error messages.
const PROVIDED: &str =
    "txstore:store/storage and txstore:store/state, each @0.1.0 and @0.2.0, and WASI 0.2 \
                        (cli, clocks, filesystem, io, random, sockets; with no files, environment, \
                        network or clock)";

/// One line for a failed link, naming the import wasmtime could not match
/// (its message has the form "component imports instance `NAME`, but ...").
pub(crate) fn link_error(label: &str, message: &str) -> anyhow::Error {
    let name = message
        .split_once("imports instance `")
        .or_else(|| message.split_once("imports func `"))
        .and_then(|(_, rest)| rest.split_once('`'))
        .map(|(name, _)| name);
    match name {
        Some(name) => {
            let why = message.split_once(": ").map_or(message, |(_, why)| why);
            anyhow::anyhow!(
                "guest {label} imports `{name}`, which this host does not provide in the form the guest expects \
                 ({why}); the host links only {PROVIDED}: rebuild the guest without that import"
            )
        }
        None => anyhow::anyhow!("guest {label} cannot be linked: {message}"),
    }
}

/// The worlds of wit/ a component may implement.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum World {
    /// A strategy: exports `state-store`, imports `storage`.
    Store,
    /// User logic: exports `processor`, imports `state`.
    Processor,
}

impl World {
    fn name(self) -> &'static str {
        match self {
            World::Store => "store",
            World::Processor => "processor",
        }
    }

    fn export(self) -> &'static str {
        match self {
            World::Store => "state-store",
            World::Processor => "record-processor",
        }
    }

    fn import(self) -> &'static str {
        match self {
            World::Store => "storage",
            World::Processor => "state",
        }
    }

    /// The versions of this world the host links, oldest first.
    fn versions(self) -> &'static [&'static str] {
        WIT_VERSIONS
    }
}

/// Checks that the component exports our `world`'s interface at a version
/// the host links, all of it at that one version, and imports nothing but
/// that world's import and WASI. Returns (exports, imports, version).
pub(super) fn check_world(
    label: &str,
    engine: &Engine,
    component: &Component,
    world: World,
) -> Result<(Vec<String>, Vec<String>, &'static str)> {
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let imports: Vec<String> = ty.imports(engine).map(|(n, _)| n.to_string()).collect();
    let ours = |name: &str| -> Option<(String, String)> {
        let rest = name.strip_prefix(&format!("{WIT_PACKAGE}/"))?;
        let (iface, version) = rest.split_once('@')?;
        Some((iface.to_string(), version.to_string()))
    };
    let what = match world {
        World::Store => "guest",
        World::Processor => "processor",
    };
    // The kind first (a store named as a processor is told so, whatever
    // its version), then the version.
    if !exports
        .iter()
        .any(|n| ours(n).is_some_and(|(i, _)| i == world.export()))
    {
        bail!(
            "{what} {label} does not export {WIT_PACKAGE}/{}@{} (it exports: {});{}",
            world.export(),
            world.versions()[world.versions().len() - 1],
            if exports.is_empty() {
                "nothing".to_string()
            } else {
                exports.join(", ")
            },
            other_world_hint(world, &exports, &ours)
        );
    }
    let version = built_against(label, what, world, exports.iter().chain(&imports), &ours)?;
    let provided = format!("{WIT_PACKAGE}/{}@{version} and WASI 0.2", world.import());
    for name in &imports {
        let allowed = match ours(name) {
            Some((iface, _)) => iface == world.import() || iface == "types",
            None => name.starts_with("wasi:"),
        };
        if !allowed {
            bail!("{what} {label} imports `{name}`, which this host does not provide to a {} component; it links only {provided}", world.name());
        }
    }
    Ok((exports, imports, version))
}

/// What to do about a component that does not export `world`'s interface:
/// name it where its own world belongs, or build it against `world`.
fn other_world_hint(
    world: World,
    exports: &[String],
    ours: &dyn Fn(&str) -> Option<(String, String)>,
) -> String {
    let other = match world {
        World::Store => World::Processor,
        World::Processor => World::Store,
    };
    if exports
        .iter()
        .any(|n| ours(n).is_some_and(|(i, _)| i == other.export()))
    {
        format!(
            " it is a {} component: name it in {}",
            other.name(),
            match other {
                World::Store => "store.guest",
                World::Processor => "task.processor",
            }
        )
    } else {
        format!(" build it against the `{}` world of wit/", world.name())
    }
}

/// The one version of `world` that every name of our package in `names`
/// has; refused when one is a version the host does not link, or when
/// they mix two.
fn built_against<'a>(
    label: &str,
    what: &str,
    world: World,
    names: impl Iterator<Item = &'a String>,
    ours: &dyn Fn(&str) -> Option<(String, String)>,
) -> Result<&'static str> {
    let versions = world.versions();
    let mut found: Option<&'static str> = None;
    for name in names {
        let Some((_, version)) = ours(name) else {
            continue;
        };
        let Some(known) = versions.iter().copied().find(|v| *v == version) else {
            let want = versions
                .iter()
                .map(|v| format!("{WIT_PACKAGE}@{v}"))
                .collect::<Vec<_>>()
                .join(" and ");
            bail!(
                "{what} {label} was built against {WIT_PACKAGE}@{version}, but this host provides {want} \
                 for a {} component",
                world.name()
            );
        };
        match found {
            Some(v) if v != known => bail!(
                "{what} {label} mixes {WIT_PACKAGE}@{v} and @{known}: build it against one version"
            ),
            _ => found = Some(known),
        }
    }
    Ok(found.unwrap_or(versions[versions.len() - 1]))
}
