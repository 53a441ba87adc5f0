//! The bench report as a markdown table and as SVG plots.

use super::{Figures, Report};
use anyhow::Result;
use plotters::prelude::*;
use std::path::Path;

fn rate(r: f64) -> String {
    if r >= 1e6 {
        format!("{:.2} M/s", r / 1e6)
    } else {
        format!("{:.0} k/s", r / 1e3)
    }
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map_or("—".into(), |v| format!("{v:.1} {unit}"))
}

/// One row per target; ratios are to the native row of the same run.
pub fn markdown(r: &Report) -> String {
    let n = &r.native;
    let mut out = format!(
        "{} keys of 16 bytes, 100-byte values, a commit every {} records, {} cores, medians of {} runs{}\n\n\
         | store | write uniform | × native | write zipf | × native | write cached | × native | read committed | read uncommitted | scan | commit p50 | commit p99 | load cold | load cached | instantiate | guest memory |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        r.keys,
        r.commit_every,
        r.cores,
        r.runs,
        if r.guest_options.is_empty() {
            String::new()
        } else {
            let o: Vec<String> = r.guest_options.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!(", guest options {}", o.join(" "))
        }
    );
    for f in std::iter::once(n).chain(&r.guests) {
        out.push_str(&format!(
            "| {} | {} | {:.2} | {} | {:.2} | {} | {:.2} | {} | {} | {} | {:.0} µs | {:.0} µs | {} | {} | {} | {} |\n",
            f.target,
            rate(f.write_uniform_per_s),
            f.write_uniform_per_s / n.write_uniform_per_s,
            rate(f.write_zipf_per_s),
            f.write_zipf_per_s / n.write_zipf_per_s,
            rate(f.write_cached_per_s),
            f.write_cached_per_s / n.write_cached_per_s,
            rate(f.read_committed_per_s),
            rate(f.read_uncommitted_per_s),
            rate(f.scan_entries_per_s),
            f.commit_p50_us,
            f.commit_p99_us,
            opt(f.load_cold_ms, "ms"),
            opt(f.load_cached_ms, "ms"),
            opt(f.instantiate_us, "µs"),
            f.guest_peak_memory_bytes.map_or("—".into(), |b| format!("{:.1} MiB", b as f64 / (1 << 20) as f64)),
        ));
    }
    let sizes: Vec<u64> = r
        .guests
        .first()
        .map(|g| g.recovery.iter().map(|(s, _, _)| *s).collect())
        .unwrap_or_default();
    if !sizes.is_empty() {
        out.push_str("\nRecovery after a crash with one full uncommitted transaction on disk (open, recover, replay):\n\n| store |");
        for s in &sizes {
            out.push_str(&format!(" {s} keys |"));
        }
        out.push_str("\n|---|");
        out.push_str(&"---|".repeat(sizes.len()));
        out.push('\n');
        for g in &r.guests {
            out.push_str(&format!("| {} |", g.target));
            for (_, secs, action) in &g.recovery {
                out.push_str(&format!(" {:.3} s ({action}) |", secs));
            }
            out.push('\n');
        }
    }
    out
}

const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];

/// `throughput.svg` (write ratio to native per guest, uniform and zipf)
/// and `recovery.svg` (recovery time against state size, log-log).
pub fn plots(r: &Report, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    throughput(r, &dir.join("throughput.svg"))?;
    if r.guests.iter().any(|g| !g.recovery.is_empty()) {
        recovery(&r.guests, &dir.join("recovery.svg"))?;
    }
    Ok(())
}

fn throughput(r: &Report, path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (800, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let ratios: Vec<(String, [f64; 3])> = r
        .guests
        .iter()
        .map(|g| {
            let n = &r.native;
            (
                g.target.clone(),
                [
                    g.write_uniform_per_s / n.write_uniform_per_s,
                    g.write_zipf_per_s / n.write_zipf_per_s,
                    g.write_cached_per_s / n.write_cached_per_s,
                ],
            )
        })
        .collect();
    let top = ratios.iter().flat_map(|(_, r)| *r).fold(1.0f64, f64::max) * 1.15;
    let n = ratios.len().max(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "write throughput / native RocksDB (same run)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..n, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("ratio")
        .draw()?;
    for (i, (name, bars)) in ratios.iter().enumerate() {
        let x = i as f64;
        chart.draw_series(bars.iter().enumerate().map(|(j, &ratio)| {
            let left = x + 0.1 + 0.27 * j as f64;
            Rectangle::new([(left, 0.0), (left + 0.25, ratio)], COLORS[j].filled())
        }))?;
        chart.draw_series([Text::new(
            name.clone(),
            (x + 0.2, -top * 0.04),
            ("sans-serif", 14),
        )])?;
    }
    chart
        .draw_series(LineSeries::new(
            [(0.0, 1.0), (n, 1.0)],
            BLACK.stroke_width(1),
        ))?
        .label("native = 1");
    chart
        .draw_series([Rectangle::new([(0.0, 0.0), (0.0, 0.0)], COLORS[0].filled())])?
        .label("uniform keys")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], COLORS[0].filled()));
    chart
        .draw_series([Rectangle::new([(0.0, 0.0), (0.0, 0.0)], COLORS[1].filled())])?
        .label("zipf keys")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], COLORS[1].filled()));
    chart
        .draw_series([Rectangle::new([(0.0, 0.0), (0.0, 0.0)], COLORS[2].filled())])?
        .label("uniform, through the write cache (both sides)")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], COLORS[2].filled()));
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}

fn recovery(guests: &[Figures], path: &Path) -> Result<()> {
    let root = SVGBackend::new(path, (800, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let points = || guests.iter().flat_map(|g| g.recovery.iter());
    let (min_s, max_s) =
        points().fold((u64::MAX, 1u64), |(a, b), (s, _, _)| (a.min(*s), b.max(*s)));
    let (min_t, max_t) = points().fold((f64::MAX, 0.0f64), |(a, b), (_, t, _)| {
        (a.min(*t), b.max(*t))
    });
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "recovery after a crash with a full uncommitted transaction",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(
            ((min_s as f64) * 0.8..(max_s as f64) * 1.25).log_scale(),
            (min_t * 0.5..max_t * 2.0).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("keys in the store")
        .y_desc("seconds")
        .draw()?;
    for (i, g) in guests.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let series: Vec<(f64, f64)> = g.recovery.iter().map(|(s, t, _)| (*s as f64, *t)).collect();
        chart
            .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?
            .label(g.target.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            series
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}
