//! Presenting and recording results.
//!
//! Owns: ratio and number formatting for the human summary, the UTC date
//! stamp, the git commit lookup, and appending one JSON line per run to
//! `bench/results/results.jsonl`. Pure helpers are unit-tested; the file and
//! `git` are touched only by [`record`] and [`git_commit`].

use anyhow::Context as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// `a / b` when both are finite and `b` is not zero.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (a.is_finite() && b.is_finite() && b != 0.0).then(|| a / b)
}

/// `1.23×`, or `n/a` when there is no ratio.
pub fn fmt_ratio(r: Option<f64>) -> String {
    match r {
        Some(r) if r >= 100.0 => format!("{r:.0}×"),
        Some(r) if r >= 10.0 => format!("{r:.1}×"),
        Some(r) => format!("{r:.2}×"),
        None => "n/a".to_string(),
    }
}

/// Verdict against a target: lower-is-better (memory) or higher-is-better
/// (throughput). `None` when the figure is missing.
pub fn verdict(value: Option<f64>, target: f64, lower_is_better: bool) -> &'static str {
    match value {
        None => "no figure",
        Some(v) if lower_is_better && v <= target => "meets target",
        Some(v) if !lower_is_better && v >= target => "meets target",
        Some(_) => "MISSES target",
    }
}

/// Thousands separated with `,`: `172,345`.
pub fn fmt_int(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        // (`is_multiple_of` needs Rust 1.87; the workspace supports 1.85.)
        if i > 0 && matches!((s.len() - i) % 3, 0) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rate as a whole number with separators, or `n/a` (e.g. no CPU time was
/// measurable: /proc counts in 10 ms ticks).
pub fn fmt_rate(r: Option<f64>) -> String {
    match r {
        Some(r) if r.is_finite() && r >= 0.0 => fmt_int(r.round() as u64),
        _ => "n/a".to_string(),
    }
}

/// Microseconds as milliseconds with two decimals, or `n/a`.
pub fn fmt_ms(us: Option<u64>) -> String {
    match us {
        Some(us) => format!("{:.2} ms", us as f64 / 1000.0),
        None => "n/a".to_string(),
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `2025-01-31T12:34:56Z` for a Unix time in seconds.
pub fn utc_string(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let rem = unix_secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

pub fn utc_now() -> String {
    utc_string(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    )
}

/// Directory of this crate (bench/), fixed at build time.
pub fn bench_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn default_results_path() -> PathBuf {
    bench_dir().join("results").join("results.jsonl")
}

/// Tells where a drawn plot is; a smoke run's plot was drawn only to prove
/// the drawing works, so it is removed.
pub fn show_plot(c: &crate::opts::CommonArgs, path: &Path) {
    if c.smoke {
        let _ = std::fs::remove_file(path);
        println!("  plot drawn (smoke run: removed again)");
    } else {
        println!("  plot: {}", path.display());
    }
}

/// Where a scenario's plot goes: beside the results file, named by scenario
/// and time (smoke runs and `--no-record` runs write to the temp directory).
pub fn plot_path(c: &crate::opts::CommonArgs, name: &str) -> PathBuf {
    let stamp = utc_now().replace(':', "");
    let file = format!("{name}-{stamp}.png");
    if c.no_record || c.smoke {
        return std::env::temp_dir().join(file);
    }
    c.results
        .parent()
        .map(|d| d.join("plots"))
        .unwrap_or_else(|| PathBuf::from("."))
        .join(file)
}

/// `git rev-parse --short HEAD` in the repository, if git and the repo are there.
pub fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(bench_dir())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

/// Adds `date` and `commit` to `line` and appends it to `path` as one JSON line.
pub fn record(path: &Path, mut line: serde_json::Value) -> anyhow::Result<()> {
    if let Some(obj) = line.as_object_mut() {
        obj.insert("date".into(), utc_now().into());
        obj.insert("commit".into(), git_commit().into());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(f, "{line}").with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
        assert_eq!(fmt_ratio(Some(1.5)), "1.50×");
        assert_eq!(fmt_ratio(Some(0.456)), "0.46×");
        assert_eq!(fmt_ratio(Some(12.34)), "12.3×");
        assert_eq!(fmt_ratio(Some(1234.0)), "1234×");
        assert_eq!(fmt_ratio(None), "n/a");
        assert_eq!(fmt_ratio(ratio(6.6, 3.0)), "2.20×");
    }

    #[test]
    fn verdicts() {
        assert_eq!(verdict(Some(2.9), 3.0, true), "meets target");
        assert_eq!(verdict(Some(3.1), 3.0, true), "MISSES target");
        assert_eq!(verdict(Some(150_000.0), 150_000.0, false), "meets target");
        assert_eq!(verdict(Some(149_999.0), 150_000.0, false), "MISSES target");
        assert_eq!(verdict(None, 1.0, false), "no figure");
    }

    #[test]
    fn integers_and_ms() {
        assert_eq!(fmt_int(0), "0");
        assert_eq!(fmt_int(999), "999");
        assert_eq!(fmt_int(1000), "1,000");
        assert_eq!(fmt_int(172_345), "172,345");
        assert_eq!(fmt_int(1_234_567), "1,234,567");
        assert_eq!(fmt_ms(Some(1234)), "1.23 ms");
        assert_eq!(fmt_ms(None), "n/a");
        assert_eq!(fmt_rate(Some(125_786.4)), "125,786");
        assert_eq!(fmt_rate(None), "n/a");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_string(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_string(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_string(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(utc_string(4_102_444_799), "2099-12-31T23:59:59Z");
    }
}
