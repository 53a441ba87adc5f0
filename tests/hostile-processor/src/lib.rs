//! Test only: a processor that behaves like `kv` (`key<TAB>value` puts)
//! until a record's value asks it to misbehave, so the host's tests can show
//! what the sandbox does to a processor:
//! - `spin`: loops forever (the time limit must stop it);
//! - `grow`: allocates without end (the memory limit must stop it);
//! - `trap`: panics (a trap);
//! - `refuse`: returns an error;
//! - `put-flood`: puts one 16 MiB value under 100 keys (the host must
//!   not copy 1.6 GB: the per-record write limit must stop it);
//! - `output-flood`: returns 200,000 output records;
//! - `big-output`: returns one output record of 2 MiB (more than a Kafka
//!   producer sends by default);
//! - `state-in-init` as an option: calls `state` from `init`.

wit_bindgen::generate!({ path: "../../wit/0.1.0", world: "processor" });

use exports::txstore::store::record_processor::{Guest, Input, Output};
use txstore::store::state;

struct Hostile;

impl Guest for Hostile {
    fn init(options: Vec<(String, String)>) -> Result<(), String> {
        for (name, _) in options {
            match name.as_str() {
                "state-in-init" => {
                    state::get(b"k").map_err(|e| format!("{e:?}"))?;
                }
                other => return Err(format!("unknown option `{other}`")),
            }
        }
        Ok(())
    }

    fn process(record: Input) -> Result<Vec<Output>, String> {
        let line = record.value.unwrap_or_default();
        let Some(tab) = line.iter().position(|&b| b == b'\t') else {
            return Ok(Vec::new());
        };
        let (key, value) = (&line[..tab], &line[tab + 1..]);
        match value {
            b"spin" => {
                let mut x: u64 = 1;
                loop {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                }
            }
            b"grow" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            b"trap" => panic!("planted trap on key {}", key.escape_ascii()),
            b"refuse" => return Err(format!("refused key {}", key.escape_ascii())),
            b"put-flood" => {
                let big = vec![7u8; 16 << 20];
                for i in 0..100u32 {
                    state::put(&i.to_be_bytes(), &big).map_err(|e| format!("{e:?}"))?;
                }
            }
            b"big-output" => {
                return Ok(vec![Output { key: key.to_vec(), value: Some(vec![b'x'; 2 << 20]) }]);
            }
            b"output-flood" => {
                return Ok((0..200_000u32)
                    .map(|i| Output { key: i.to_be_bytes().to_vec(), value: None })
                    .collect());
            }
            _ => {}
        }
        state::put(key, value).map_err(|e| format!("{e:?}"))?;
        Ok(vec![Output { key: key.to_vec(), value: Some(value.to_vec()) }])
    }
}

export!(Hostile);
