//! `txstore bench --pipeline LINES`: the whole of `txstore run` per store.
//! The same input file goes through the task's loop (a built-in processor,
//! the write cache, the embedded changelog, file output, commits every
//! 100 ms as configured by default) once with each guest and once with the
//! `native` store (wipe-on-crash in Rust, no sandbox), so the ratio is
//! what a user of the whole pipeline pays for a guest: the boundary and
//! the strategy's own work together. Runs go round-robin over the stores
//! and each figure is the median.

use super::{median, Zipf};
use crate::config::{Config, OutputSpec, ProcessorSpec};
use crate::rng::Rng;
use crate::runtime::Runtime;
use crate::task::Task;
use anyhow::Result;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Distinct words of the word-count input (Zipf-distributed, as text is).
const VOCABULARY: u64 = 20_000;
const WORDS_PER_LINE: usize = 8;
/// Distinct keys of the kv input (uniform) and its values' length.
const KV_KEYS: u64 = 100_000;
const KV_VALUE_LEN: usize = 100;

#[derive(Clone, Debug)]
pub struct Options {
    /// Input lines per processor.
    pub lines: u64,
    /// The guests, measured against `native`.
    pub guests: Vec<String>,
    pub guest_options: Vec<(String, String)>,
    pub runs: usize,
    pub progress: bool,
}

/// One store's figures: input records per second through the whole run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Figures {
    pub target: String,
    pub word_count_per_s: f64,
    pub kv_per_s: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub lines: u64,
    pub runs: usize,
    pub cores: usize,
    pub native: Figures,
    pub guests: Vec<Figures>,
}

/// The word-count input: `WORDS_PER_LINE` Zipf-chosen words a line.
fn word_count_input(path: &Path, lines: u64) -> Result<()> {
    let zipf = Zipf::new(VOCABULARY);
    let mut rng = Rng::new(1);
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for _ in 0..lines {
        let words: Vec<String> = (0..WORDS_PER_LINE)
            .map(|_| format!("w{}", zipf.sample(&mut rng)))
            .collect();
        writeln!(out, "{}", words.join(" "))?;
    }
    out.flush()?;
    Ok(())
}

/// The kv input: `key<TAB>value` puts over `KV_KEYS` keys, one line in 16
/// a delete (`key` alone).
fn kv_input(path: &Path, lines: u64) -> Result<()> {
    let mut rng = Rng::new(2);
    let value = "v".repeat(KV_VALUE_LEN);
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for _ in 0..lines {
        let k = rng.below(KV_KEYS);
        if rng.below(16) == 0 {
            writeln!(out, "k{k:08}")?;
        } else {
            writeln!(out, "k{k:08}\t{value}")?;
        }
    }
    out.flush()?;
    Ok(())
}

/// One `txstore run` of `input` on `target` in a fresh state directory:
/// input records per second from open to close.
fn run_once(
    runtime: &Runtime,
    target: &str,
    options: &[(String, String)],
    processor: ProcessorSpec,
    input: &Path,
) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let mut config = Config::new(target, &dir.path().join("state"));
    if target != crate::runtime::NATIVE {
        config.add_init_options(options);
    }
    config.task.processor = processor;
    config.task.output = Some(OutputSpec::File {
        path: dir.path().join("out.tsv"),
    });
    let started = Instant::now();
    let (mut task, _) = Task::open(&config, runtime)?;
    crate::task::feed::feed(&mut task, input, None, false)?;
    let stats = task.close()?;
    Ok(stats.records as f64 / started.elapsed().as_secs_f64())
}

pub fn run(runtime: &Runtime, opts: &Options) -> Result<Report> {
    let inputs = tempfile::tempdir()?;
    let (words, kv): (PathBuf, PathBuf) = (
        inputs.path().join("words.txt"),
        inputs.path().join("kv.tsv"),
    );
    word_count_input(&words, opts.lines)?;
    kv_input(&kv, opts.lines)?;
    let targets: Vec<&str> = std::iter::once(crate::runtime::NATIVE)
        .chain(opts.guests.iter().map(String::as_str))
        .collect();
    let runs = opts.runs.max(1);
    let bar = if opts.progress {
        indicatif::ProgressBar::new((runs * targets.len() * 2) as u64)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:24} {bar:40} {pos}/{len} {elapsed}").unwrap(),
    );
    // (word count, kv) rates per target, one run of each per round.
    let mut rates: Vec<(Vec<f64>, Vec<f64>)> = vec![Default::default(); targets.len()];
    for _ in 0..runs {
        for (t, target) in targets.iter().enumerate() {
            bar.set_message(format!("{target} word count"));
            let wc = run_once(
                runtime,
                target,
                &opts.guest_options,
                ProcessorSpec::WordCount,
                &words,
            )?;
            bar.inc(1);
            bar.set_message(format!("{target} kv"));
            let k = run_once(runtime, target, &opts.guest_options, ProcessorSpec::Kv, &kv)?;
            bar.inc(1);
            rates[t].0.push(wc);
            rates[t].1.push(k);
        }
    }
    bar.finish_and_clear();
    let mut figures = targets
        .iter()
        .zip(rates)
        .map(|(target, (mut wc, mut kv))| Figures {
            target: target.to_string(),
            word_count_per_s: median(&mut wc),
            kv_per_s: median(&mut kv),
        });
    let native = figures.next().expect("native is measured");
    Ok(Report {
        lines: opts.lines,
        runs,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        native,
        guests: figures.collect(),
    })
}

/// One row per store; ratios are to `native` in the same run.
pub fn markdown(r: &Report) -> String {
    let n = &r.native;
    let mut out = format!(
        "`txstore run` over {} input lines per processor (word count: {WORDS_PER_LINE} Zipf words of \
         {VOCABULARY} a line; kv: puts of {KV_VALUE_LEN}-byte values over {KV_KEYS} keys, 1 in 16 a \
         delete), embedded changelog, file output, default commit interval; {} cores, medians of {} runs\n\n\
         | store | word count records/s | × native | kv records/s | × native |\n|---|---|---|---|---|\n",
        r.lines, r.cores, r.runs
    );
    for f in std::iter::once(n).chain(&r.guests) {
        out.push_str(&format!(
            "| {} | {:.0} | {:.2} | {:.0} | {:.2} |\n",
            f.target,
            f.word_count_per_s,
            f.word_count_per_s / n.word_count_per_s,
            f.kv_per_s,
            f.kv_per_s / n.kv_per_s,
        ));
    }
    out
}
