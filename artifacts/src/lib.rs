//! The built-in guests, compiled from `guests/` by build.rs and embedded in
//! the binary so they travel with it.

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
