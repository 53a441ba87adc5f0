//! A Kafka-input run whose worker fails ends, at once, with one error
//! line, so a supervisor restarts it: never a process that keeps its
//! group membership and stalls its partitions. Every way a task fails in
//! the pipeline: the processor traps or refuses a record, its output is
//! refused by the producer, another instance fences it.

use crate::kafka::broker;
use crate::pipeline::{
    differences, multiset, produce, read_committed, static_config, stop, Pipeline, PARTITIONS,
};
use crate::processors::hostile_processor;
use std::time::{Duration, Instant};

/// Waits for `child` to exit, at most `within`; returns its log.
fn exits_with_one_error(
    p: &Pipeline,
    child: &mut std::process::Child,
    label: &str,
    within: Duration,
    says: &str,
) {
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < within,
            "{label} still runs {within:?} after its worker failed ({says}): {}",
            p.log(label)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = p.log(label);
    assert!(!status.success(), "{label} exited cleanly: {log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.starts_with("error")).collect();
    assert!(
        errors.len() == 1 && errors[0].contains(says),
        "{label} should stop with one line saying `{says}`: {log}"
    );
}

#[test]
fn a_failing_worker_ends_the_process_with_one_line() {
    let Some(bootstrap) = broker("a_failing_worker_ends_the_process_with_one_line") else {
        return;
    };
    let wasm = hostile_processor().to_str().unwrap();
    for (bad, says) in [
        ("trap", "planted trap"),
        ("refuse", "refused a record"),
        ("big-output", "topic `"),
    ] {
        let p = Pipeline::new(bootstrap, "buffered", wasm);
        let mut input = Vec::new();
        for part in 0..PARTITIONS {
            for i in 0..200 {
                let line = if part == 3 && i == 100 {
                    format!("k{i}\t{bad}")
                } else {
                    format!("k{i}\tv{i}")
                };
                input.push((part, format!("k{i}").into_bytes(), Some(line.into_bytes())));
            }
        }
        produce(bootstrap, &p.input, &input);
        let all: Vec<i32> = (0..PARTITIONS).collect();
        let mut child = p.spawn(&static_config(&p, 0, 2, &all), "p0");
        exits_with_one_error(&p, &mut child, "p0", Duration::from_secs(60), says);
    }
}

/// A second instance takes the partitions over: the first is fenced at
/// its next commit and exits within seconds with one line; the second
/// finishes, and the output is exact.
#[test]
fn a_fenced_process_exits_and_its_successor_finishes_exactly() {
    let Some(bootstrap) = broker("a_fenced_process_exits_and_its_successor_finishes_exactly")
    else {
        return;
    };
    let p = Pipeline::new(bootstrap, "roll-forward", "kv");
    let (input, expected) = crate::pipeline::workload("kv", 3_000);
    let all: Vec<i32> = (0..PARTITIONS).collect();
    let half = input.len() / 2;
    produce(bootstrap, &p.input, &input[..half]);
    let mut first = p.spawn(&static_config(&p, 0, 2, &all), "first");
    p.wait_for_output(expected.len() / 10, Duration::from_secs(120), "fenced");
    let mut second = p.spawn(&static_config(&p, 1, 2, &all), "second");
    let deadline = Instant::now() + Duration::from_secs(120);
    while p.log("second").matches("partition opened").count() < PARTITIONS as usize {
        assert!(
            Instant::now() < deadline,
            "the second never opened: {}",
            p.log("second")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // More input: the first, if still alive, tries to commit and is fenced.
    produce(bootstrap, &p.input, &input[half..]);
    exits_with_one_error(&p, &mut first, "first", Duration::from_secs(30), "fenced");
    p.wait_for_output(expected.len(), Duration::from_secs(180), "fenced");
    stop(&mut second, "second", &p);
    let got = read_committed(bootstrap, &p.output, PARTITIONS);
    assert!(
        multiset(&got) == multiset(&expected),
        "fenced: the output differs from the independent count: {}",
        differences(&expected, &got)
    );
}

/// Store commands on a Kafka-input config: without `--partition` they are
/// refused (the job's own directory holds no store); with it, a query of a
/// running partition is answered by its task and a write is refused by
/// the partition's lock. Neither fences the task, which finishes exactly.
#[test]
fn store_commands_never_fence_a_running_partition() {
    use crate::common::{stderr, txstore};
    let Some(bootstrap) = broker("store_commands_never_fence_a_running_partition") else {
        return;
    };
    let p = Pipeline::new(bootstrap, "buffered", "kv");
    let (input, expected) = crate::pipeline::workload("kv", 3_000);
    let all: Vec<i32> = (0..PARTITIONS).collect();
    let config = static_config(&p, 0, 2, &all);
    let c = config.to_str().unwrap();
    let refused = txstore(&["get", "k1", "--config", c]);
    assert!(
        !refused.status.success() && stderr(&refused).contains("--partition"),
        "{}",
        stderr(&refused)
    );
    assert!(
        !p.dir.path().join("state-0").join("store").exists(),
        "a stray store was made"
    );
    produce(bootstrap, &p.input, &input[..input.len() / 2]);
    let mut run = p.spawn(&config, "p0");
    p.wait_for_output(expected.len() / 10, Duration::from_secs(120), "queries");
    for _ in 0..5 {
        let got = txstore(&["scan", "--config", c, "--partition", "0", "--count"]);
        assert!(got.status.success(), "a live scan failed: {}", stderr(&got));
        let put = txstore(&["put", "x", "1", "--config", c, "--partition", "0"]);
        assert!(
            !put.status.success() && stderr(&put).contains("in use"),
            "a write to a running partition: {}",
            stderr(&put)
        );
    }
    produce(bootstrap, &p.input, &input[input.len() / 2..]);
    p.wait_for_output(expected.len(), Duration::from_secs(180), "queries");
    stop(&mut run, "p0", &p);
    let got = read_committed(bootstrap, &p.output, PARTITIONS);
    assert!(
        multiset(&got) == multiset(&expected),
        "queries: the output differs from the independent count: {}",
        differences(&expected, &got)
    );
}
