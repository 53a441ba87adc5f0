//! What a conformance run exercised, so that a pass says what it proves:
//! the contract functions called (counted in the child runs), the argument
//! classes the workloads passed them, the crash modes and guarantees
//! explored, and how many recovered states and reads were compared.

use super::workload::{self, Model, Shape, Step};
use crate::changelog::Record;
use crate::runtime::Isolation;
use std::collections::{BTreeMap, BTreeSet};

/// Every export of `state-store`, in the WIT's order.
pub const FUNCTIONS: &[&str] = &[
    "init",
    "transactional",
    "recover",
    "get",
    "get-many",
    "range",
    "put",
    "delete",
    "put-many",
    "delete-many",
    "commit",
    "committed-offset",
    "approximate-uncommitted-bytes",
];

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Coverage {
    /// Export calls per function, summed over the child runs.
    pub calls: BTreeMap<String, u64>,
    /// Argument classes the workloads passed, per function.
    pub argument_classes: BTreeMap<&'static str, BTreeSet<&'static str>>,
    pub modes: BTreeSet<&'static str>,
    pub guarantees: BTreeSet<String>,
    /// Recoveries whose state was compared with the model...
    pub recoveries_checked: u64,
    /// ...and the distinct committed states among them (seed, steps).
    pub distinct_recovered_states: u64,
    /// Reads of the workloads compared with the model.
    pub reads_checked: u64,
    /// Records the guest refused with `uncommitted-limit`, each followed by
    /// an early commit (a small `--option` limit makes them happen; the
    /// task's own [`super::child::UNCOMMITTED_MAX_BYTES`] threshold commits
    /// early without a refusal, so early commits alone prove nothing).
    pub limit_refusals: u64,
    /// What the guest's `transactional` said in the workload runs: a guest
    /// that says false is held to less (read-committed reads are not
    /// compared, and a crash may wipe it), so a pass means less.
    pub transactional: Option<bool>,
    #[serde(skip)]
    states: BTreeSet<(u64, usize)>,
}

impl Coverage {
    /// Adds what one child run reported.
    pub fn add_run(&mut self, seed: u64, summary: &super::child::Summary) {
        for (f, n) in &summary.guest_calls {
            *self.calls.entry(f.clone()).or_default() += n;
        }
        self.recoveries_checked += 1;
        self.states.insert((seed, summary.resumed_at));
        self.distinct_recovered_states = self.states.len() as u64;
        self.reads_checked += summary.reads_checked;
        self.limit_refusals += summary.limit_refusals;
        self.transactional = Some(summary.transactional);
    }

    /// Adds the argument classes of a workload the runs executed.
    pub fn add_workload(&mut self, steps: &[Step]) {
        for (f, class) in classes(steps) {
            self.argument_classes.entry(f).or_default().insert(class);
        }
    }

    /// The functions no child run called.
    pub fn never_called(&self) -> Vec<&'static str> {
        FUNCTIONS
            .iter()
            .copied()
            .filter(|f| self.calls.get(*f).copied().unwrap_or(0) == 0)
            .collect()
    }

    /// The coverage as indented text lines.
    pub fn render(&self) -> String {
        let mut out = format!(
            "  coverage: {} of {} contract functions called in the workload runs\n",
            FUNCTIONS.len() - self.never_called().len(),
            FUNCTIONS.len()
        );
        out.push_str(&format!(
            "  {:<30} {:>10}  argument classes\n",
            "function", "calls"
        ));
        for f in FUNCTIONS {
            let classes: Vec<&str> = self
                .argument_classes
                .get(f)
                .map(|c| c.iter().copied().collect())
                .unwrap_or_default();
            out.push_str(&format!(
                "  {:<30} {:>10}  {}\n",
                f,
                self.calls.get(*f).copied().unwrap_or(0),
                if classes.is_empty() {
                    "-".to_string()
                } else {
                    classes.join(", ")
                }
            ));
        }
        out.push_str(match self.transactional {
            Some(true) => "  transactional: yes (read-committed compared with the last commit; no wipe allowed)\n",
            Some(false) => "  transactional: no (read-committed reads not compared; a crash may wipe the store)\n",
            None => "",
        });
        let modes: Vec<&str> = self.modes.iter().copied().collect();
        let guarantees: Vec<&str> = self.guarantees.iter().map(String::as_str).collect();
        out.push_str(&format!(
            "  crash modes: {}; guarantees: {}\n  {} recoveries checked against {} distinct committed states; {} reads compared; {} records refused with uncommitted-limit\n",
            if modes.is_empty() { "none".to_string() } else { modes.join(", ") },
            guarantees.join(", "),
            self.recoveries_checked,
            self.distinct_recovered_states,
            self.reads_checked,
            self.limit_refusals
        ));
        out
    }
}

fn key_classes(k: &[u8], out: &mut Vec<&'static str>) {
    if k.is_empty() {
        out.push("empty key");
    }
    if std::str::from_utf8(k).is_err() {
        out.push("non-UTF-8 key");
    }
    if k.len() > 255 {
        out.push("key over 255 bytes");
    }
    if k.len() > 64 << 10 {
        out.push("key over 64 KiB");
    }
}

fn presence(model: &Model, k: &[u8]) -> &'static str {
    if model.contains_key(k) {
        "present key"
    } else {
        "absent key"
    }
}

fn iso_class(iso: Isolation) -> &'static str {
    match iso {
        Isolation::ReadCommitted => "read-committed",
        Isolation::ReadUncommitted => "read-uncommitted",
    }
}

/// The (function, argument class) pairs a workload passes, found by
/// running it against the model as the child does (without early commits,
/// which only make transactions smaller).
pub fn classes(steps: &[Step]) -> BTreeSet<(&'static str, &'static str)> {
    let mut out = BTreeSet::new();
    let mut live = Model::new();
    let mut pending = 0usize;
    for step in steps {
        let mut add = |f: &'static str, classes: &[&'static str]| {
            for c in classes {
                out.insert((f, *c));
            }
        };
        match step {
            Step::Write(records, shape) => {
                for (f, c) in write_classes(records, *shape, &live) {
                    add(f, &c);
                }
                pending += records.len();
                workload::apply(&mut live, records);
            }
            Step::Commit => {
                if pending == 0 {
                    add("commit", &["empty transaction"]);
                } else if pending >= 1000 {
                    add("commit", &["1,000+ writes"]);
                } else {
                    add("commit", &["small transaction"]);
                }
                pending = 0;
            }
            Step::Read(k, iso) => {
                let mut c = vec![iso_class(*iso), presence(&live, k)];
                key_classes(k, &mut c);
                add("get", &c);
            }
            Step::ReadMany(keys, iso) => {
                let mut c = vec![iso_class(*iso)];
                if keys.is_empty() {
                    c.push("no keys");
                }
                if keys.iter().collect::<BTreeSet<_>>().len() < keys.len() {
                    c.push("a key twice");
                }
                for k in keys {
                    c.push(presence(&live, k));
                    key_classes(k, &mut c);
                }
                add("get-many", &c);
            }
            Step::Range(start, end, iso, page) => add(
                "range",
                &range_classes(start.as_deref(), end.as_deref(), *iso, *page),
            ),
            Step::Empty => {
                add("put-many", &["empty list"]);
                add("delete-many", &["empty list"]);
                add("get-many", &["no keys"]);
                add("range", &["limit 0"]);
            }
        }
    }
    out
}

/// The calls one record's writes make, each with the classes of its
/// arguments (against `live`, the store before them).
fn write_classes(
    records: &[Record],
    shape: Shape,
    live: &Model,
) -> Vec<(&'static str, Vec<&'static str>)> {
    let mut c = Vec::new();
    for r in records {
        key_classes(r.key(), &mut c);
        c.push(presence(live, r.key()));
        if let Record::Put(_, v) = r {
            if v.is_empty() {
                c.push("empty value");
            }
            if v.len() > 64 << 10 {
                c.push("value over 64 KiB");
            }
        }
    }
    let is_put = |r: &Record| matches!(r, Record::Put(..));
    match shape {
        Shape::Single => records
            .iter()
            .map(|r| (if is_put(r) { "put" } else { "delete" }, c.clone()))
            .collect(),
        Shape::Batched => {
            let keys: BTreeSet<&[u8]> = records.iter().map(Record::key).collect();
            if keys.len() < records.len() {
                c.push("a key twice");
            }
            if records.len() >= 1000 {
                c.push("1,000+ entries");
            }
            let mut calls = Vec::new();
            if records.iter().any(is_put) {
                calls.push(("put-many", c.clone()));
            }
            if records.iter().any(|r| !is_put(r)) {
                calls.push(("delete-many", c));
            }
            calls
        }
    }
}

fn range_classes(
    start: Option<&[u8]>,
    end: Option<&[u8]>,
    iso: Isolation,
    page: u32,
) -> Vec<&'static str> {
    let mut c = vec![iso_class(iso)];
    c.push(match page {
        1 => "limit 1",
        u32::MAX => "limit 2^32-1",
        _ => "limit 2 to 1024",
    });
    if start.is_none() {
        c.push("open start");
    }
    if end.is_none() {
        c.push("open end");
    }
    if start.is_some() && start == end {
        c.push("start = end");
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_workload_reaches_every_write_and_read_class() {
        let mut cov = Coverage::default();
        for seed in 1..=5 {
            cov.add_workload(&workload::generate(seed, 200));
        }
        let has = |f: &str, c: &str| cov.argument_classes.get(f).is_some_and(|s| s.contains(c));
        for c in [
            "empty key",
            "non-UTF-8 key",
            "key over 64 KiB",
            "empty value",
        ] {
            assert!(has("put", c) || has("put-many", c), "{c}");
        }
        assert!(has("put", "non-UTF-8 key") && has("put-many", "non-UTF-8 key"));
        assert!(has("put-many", "1,000+ entries"));
        assert!(has("put-many", "a key twice"));
        let deletes = |c: &str| has("delete", c) || has("delete-many", c);
        assert!(has("delete", "present key") || has("delete", "absent key"));
        assert!(deletes("present key") && deletes("absent key"));
        assert!(has("get-many", "no keys") && has("get-many", "a key twice"));
        for c in [
            "limit 0",
            "limit 1",
            "limit 2^32-1",
            "open start",
            "start = end",
        ] {
            assert!(has("range", c), "range: {c}");
        }
        assert!(has("commit", "empty transaction") && has("commit", "1,000+ writes"));
    }
}
