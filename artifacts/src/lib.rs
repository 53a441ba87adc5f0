//! The built-in guests and example processors, compiled from `guests/` by
//! build.rs and embedded in the binary so they travel with it.

include!(concat!(env!("OUT_DIR"), "/guests.rs"));

/// The component bytes of the built-in guest `name`.
pub fn builtin(name: &str) -> Option<&'static [u8]> {
    BUILTIN
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, wasm)| *wasm)
}

/// The names of all built-in guests.
pub fn names() -> impl Iterator<Item = &'static str> {
    BUILTIN.iter().map(|(n, _)| *n)
}

/// The component bytes of the example processor `name` (crates of the
/// `processor` world under `guests/`).
pub fn processor(name: &str) -> Option<&'static [u8]> {
    PROCESSORS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, wasm)| *wasm)
}
