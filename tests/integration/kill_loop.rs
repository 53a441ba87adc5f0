//! The Kafka pipeline the way operators meet it: six input partitions,
//! three `txstore run` processes with static assignment, input still being
//! produced while random processes are killed with SIGKILL and restarted,
//! sometimes with every partition moved to another process's state
//! directory. At the end an outside `read_committed` consumer reads the
//! output topic, and every partition's store is read back with `txstore
//! scan --partition P`: both must equal an independent computation.
//!
//! Seeded (`TXSTORE_KILL_SEED`, printed on failure). CI runs a few kills
//! per guest; `TXSTORE_LONG_TESTS=1` runs many more.

use crate::common::{ok, txstore};
use crate::kafka::broker;
use crate::pipeline::{
    differences, multiset, produce, read_committed, static_config, workload, Out, Pipeline,
    Process, PARTITIONS, PROCESSES,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A small seeded generator (xorshift), so a failing run can be repeated.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The state each partition's store must hold after all of `input`,
/// computed here from the input alone.
fn final_states(
    processor: &str,
    input: &[(i32, Vec<u8>, Option<Vec<u8>>)],
) -> BTreeMap<i32, BTreeMap<Vec<u8>, Vec<u8>>> {
    let mut states: BTreeMap<i32, BTreeMap<Vec<u8>, Vec<u8>>> = BTreeMap::new();
    for (p, key, value) in input {
        let state = states.entry(*p).or_default();
        match processor {
            "word-count" => {
                let line =
                    String::from_utf8_lossy(value.as_deref().unwrap_or_default()).into_owned();
                for w in line.split_whitespace() {
                    let n = state
                        .get(w.as_bytes())
                        .map_or(0, |v| String::from_utf8_lossy(v).parse::<u64>().unwrap());
                    state.insert(w.as_bytes().to_vec(), (n + 1).to_string().into_bytes());
                }
            }
            _ => match value {
                Some(v) => {
                    state.insert(key.clone(), v.clone());
                }
                None => {
                    state.remove(key);
                }
            },
        }
    }
    states
}

/// Which process owns which partitions in rotation `r`: process `i` owns
/// partitions `2j, 2j+1` with `j = (i + r) mod 3`.
fn owned(i: usize, rotation: usize) -> Vec<i32> {
    let j = ((i + rotation) % PROCESSES) as i32;
    vec![2 * j, 2 * j + 1]
}

struct Run<'a> {
    p: &'a Pipeline,
    children: Vec<Option<Process>>,
    rotation: usize,
    spawned: usize,
}

impl Run<'_> {
    fn config(&self, i: usize) -> PathBuf {
        static_config(self.p, i, 1 + i % 2, &owned(i, self.rotation))
    }

    fn start(&mut self, i: usize) {
        self.spawned += 1;
        let config = self.config(i);
        let label = format!("p{i}-{}", self.spawned);
        self.children[i] = Some(self.p.spawn(&config, &label));
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.children[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn kill_loop(guest: &str, processor: &str, kills: usize, seed: u64) {
    let Some(bootstrap) = broker("kill_loop") else {
        return;
    };
    let what = format!("{guest}/{processor} (TXSTORE_KILL_SEED={seed})");
    let mut rng = Rng(seed | 1);
    let p = Pipeline::new(bootstrap, guest, processor);
    let (input, expected) = workload(processor, 1_500);
    let mut run = Run {
        p: &p,
        children: (0..PROCESSES).map(|_| None).collect(),
        rotation: 0,
        spawned: 0,
    };
    for i in 0..PROCESSES {
        run.start(i);
    }
    // Input arrives in slices while processes die.
    let slices = kills + 1;
    let per_slice = input.len().div_ceil(slices);
    for (n, slice) in input.chunks(per_slice).enumerate() {
        produce(bootstrap, &p.input, slice);
        if n == slices - 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(500 + rng.below(1500)));
        if rng.below(3) == 0 {
            // Every partition moves: all die, each restarts owning
            // another process's partitions (its store there is older, or
            // none: a replay of the changelog's tail, or of all of it).
            for i in 0..PROCESSES {
                run.kill(i);
            }
            run.rotation += 1;
            for i in 0..PROCESSES {
                run.start(i);
            }
        } else {
            let i = rng.below(PROCESSES as u64) as usize;
            run.kill(i);
            run.start(i);
        }
    }
    p.wait_for_output(expected.len(), Duration::from_secs(300), &what);
    for (i, c) in run.children.iter_mut().enumerate() {
        if let Some(c) = c {
            crate::pipeline::stop(c, &format!("p{i}"), &p);
        }
    }
    let got: Vec<Out> = read_committed(&p.bootstrap, &p.output, PARTITIONS);
    assert!(
        multiset(&got) == multiset(&expected),
        "{what}: the output differs from the independent count: {}",
        differences(&expected, &got)
    );
    // Every partition's store, read where its last owner keeps it.
    let states = final_states(processor, &input);
    for i in 0..PROCESSES {
        for partition in owned(i, run.rotation) {
            let config = run.config(i);
            let out = ok(&txstore(&[
                "scan",
                "--config",
                config.to_str().unwrap(),
                "--partition",
                &partition.to_string(),
                "--format",
                "hex",
            ]));
            let store: BTreeMap<Vec<u8>, Vec<u8>> = out
                .lines()
                .map(|l| {
                    let (k, v) = l.split_once('\t').unwrap();
                    (unhex(k), unhex(v))
                })
                .collect();
            let want = states.get(&partition).cloned().unwrap_or_default();
            assert!(
                store == want,
                "{what}: partition {partition}'s store (process {i}) has {} keys, {} expected; first difference: {:?}",
                store.len(),
                want.len(),
                want.iter()
                    .find(|(k, v)| store.get(*k) != Some(v))
                    .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), String::from_utf8_lossy(v).into_owned()))
            );
        }
    }
    eprintln!(
        "{what}: {kills} kills, {} rotations, output and stores exact",
        run.rotation
    );
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn seed() -> u64 {
    std::env::var("TXSTORE_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

fn kills() -> usize {
    if std::env::var_os("TXSTORE_LONG_TESTS").is_some() {
        20
    } else {
        4
    }
}

#[test]
fn every_guest_stays_exact_under_repeated_kills_and_moves() {
    let started = Instant::now();
    let seed = seed();
    for (n, guest) in [
        "wipe-on-crash",
        "roll-forward",
        "roll-back",
        "roll-back-snapshot",
        "buffered",
    ]
    .into_iter()
    .enumerate()
    {
        kill_loop(guest, "word-count", kills(), seed.wrapping_add(n as u64));
    }
    eprintln!("kill loop: {:.0} s", started.elapsed().as_secs_f64());
}

#[test]
fn kv_stays_exact_under_repeated_kills_and_moves() {
    kill_loop("buffered", "kv", kills(), seed());
}
