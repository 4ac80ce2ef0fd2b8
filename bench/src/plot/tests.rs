use super::*;

const PNG_SIG: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];

fn tmp_path(name: &str) -> PathBuf {
    std::env::temp_dir()
        .join("plot-rs-tests")
        .join(format!("{}-{name}", std::process::id()))
}

/// Draws `chart`, checks a PNG was written, returns its size in bytes.
fn draw_ok(chart: &Chart, name: &str) -> usize {
    let path = tmp_path(name);
    draw(chart, &path).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    let bytes = std::fs::read(&path).unwrap();
    assert!(bytes.starts_with(&PNG_SIG), "{name}: not a PNG");
    std::fs::remove_file(&path).unwrap();
    bytes.len()
}

fn chart(series: Vec<Series>, log_x: bool, log_y: bool) -> Chart {
    Chart {
        title: "test chart".into(),
        x_label: "size".into(),
        y_label: "time (ns)".into(),
        log_x,
        log_y,
        series,
    }
}

fn series(name: &str, points: &[(f64, f64)]) -> Series {
    Series {
        name: name.into(),
        points: points.to_vec(),
    }
}

#[test]
fn normal_chart_log_y() {
    let a: Vec<_> = (1..=10)
        .map(|i| (i as f64 * 100.0, (i * i) as f64 * 50.0))
        .collect();
    let b: Vec<_> = (1..=10)
        .map(|i| (i as f64 * 100.0, i as f64 * 900.0))
        .collect();
    let c = chart(
        vec![series("quadratic", &a), series("linear", &b)],
        false,
        true,
    );
    let size = draw_ok(&c, "normal.png");
    assert!(size > 4096, "suspiciously small PNG: {size} bytes");
}

#[test]
fn all_axis_modes() {
    let pts: Vec<_> = (0..20)
        .map(|i| (2f64.powi(i), 3.0 + f64::from(i).powi(3)))
        .collect();
    for (lx, ly) in [(false, false), (true, false), (false, true), (true, true)] {
        let c = chart(vec![series("s", &pts)], lx, ly);
        draw_ok(&c, &format!("modes-{lx}-{ly}.png"));
    }
}

#[test]
fn no_series() {
    for log in [false, true] {
        draw_ok(&chart(vec![], log, log), &format!("no-series-{log}.png"));
    }
}

#[test]
fn all_series_empty() {
    let c = chart(vec![series("a", &[]), series("b", &[])], false, true);
    draw_ok(&c, "all-empty.png");
}

#[test]
fn single_point() {
    for (lx, ly) in [(false, false), (true, true)] {
        let c = chart(vec![series("one", &[(3.0, 7.0)])], lx, ly);
        draw_ok(&c, &format!("single-{lx}-{ly}.png"));
    }
    // Exactly on a power of ten on a log axis.
    let c = chart(vec![series("one", &[(100.0, 1000.0)])], true, true);
    draw_ok(&c, "single-pow10.png");
}

#[test]
fn all_equal_values() {
    let c = chart(
        vec![series("flat", &[(5.0, 2.0), (5.0, 2.0), (5.0, 2.0)])],
        false,
        false,
    );
    draw_ok(&c, "equal.png");
    let c = chart(
        vec![series("zeros", &[(0.0, 0.0), (0.0, 0.0)])],
        false,
        false,
    );
    draw_ok(&c, "zeros.png");
}

#[test]
fn non_finite_and_non_positive_values_skipped() {
    let pts = [
        (1.0, f64::NAN),
        (f64::INFINITY, 2.0),
        (2.0, 4.0),
        (3.0, f64::NEG_INFINITY),
        (4.0, 16.0),
        (0.0, 1.0),
        (5.0, -3.0),
    ];
    for (lx, ly) in [(false, false), (true, true)] {
        let c = chart(vec![series("messy", &pts)], lx, ly);
        draw_ok(&c, &format!("messy-{lx}-{ly}.png"));
    }
    // Nothing usable at all on a log axis: falls back to "no data".
    let c = chart(
        vec![series("neg", &[(1.0, -1.0), (2.0, 0.0), (f64::NAN, 3.0)])],
        false,
        true,
    );
    draw_ok(&c, "nothing-usable.png");
}

#[test]
fn many_series_unnamed_and_odd_path() {
    let ss: Vec<_> = (0..11)
        .map(|k| Series {
            name: if k % 2 == 0 {
                format!("s{k}")
            } else {
                String::new()
            },
            points: (0..5).map(|i| (f64::from(i), f64::from(i * k))).collect(),
        })
        .collect();
    // Nested dirs that don't exist yet, and a non-.png extension.
    let path = tmp_path("nested/dir/chart.out");
    draw(&chart(ss, false, false), &path).unwrap();
    assert!(std::fs::read(&path).unwrap().starts_with(&PNG_SIG));
    std::fs::remove_dir_all(tmp_path("nested")).unwrap();
}

#[test]
fn range_linear_pads_five_percent() {
    let (a, b) = range(&[10.0, 20.0, 30.0], false);
    assert!(
        (a - 9.0).abs() < 1e-12 && (b - 31.0).abs() < 1e-12,
        "{a} {b}"
    );
    let (a, b) = range(&[-30.0, -10.0], false);
    assert!(
        (a + 31.0).abs() < 1e-12 && (b + 9.0).abs() < 1e-12,
        "{a} {b}"
    );
    // Padding does not cross zero for one-signed data.
    assert_eq!(range(&[0.0, 100.0], false), (0.0, 105.0));
    assert_eq!(range(&[-100.0, 0.0], false), (-105.0, 0.0));
    // Mixed-sign data is padded on both sides.
    assert_eq!(range(&[-10.0, 10.0], false), (-11.0, 11.0));
}

#[test]
fn range_log_snaps_to_powers_of_ten() {
    assert_eq!(range(&[3.0, 450.0], true), (1.0, 1000.0));
    assert_eq!(range(&[0.002, 0.5], true), (1e-3, 1.0));
    assert_eq!(range(&[1.5e6, 2.5e9], true), (1e6, 1e10));
    // Data on a decade gets padded out to the next decade...
    assert_eq!(range(&[1.0, 1000.0], true), (0.1, 1e4));
    // ...but rounding noise alone does not move a bound.
    assert_eq!(range(&[1000.0], true), (100.0, 1e4));
    assert_eq!(range(&[999.9999999999], true), (100.0, 1e4));
    assert_eq!(range(&[1000.0000000001], true), (100.0, 1e4));
    // Non-positive and non-finite values are ignored.
    assert_eq!(
        range(&[-5.0, 0.0, 20.0, 70.0, f64::NAN], true),
        (10.0, 100.0)
    );
}

#[test]
fn range_single_value() {
    assert_eq!(range(&[5.0], false), (4.5, 5.5));
    assert_eq!(range(&[-5.0, -5.0], false), (-5.5, -4.5));
    assert_eq!(range(&[0.0], false), (0.0, 1.0));
    assert_eq!(range(&[150.0], true), (100.0, 1000.0));
    assert_eq!(range(&[100.0, 100.0], true), (10.0, 1000.0));
    let (a, b) = range(&[1e300], false);
    assert!(a < 1e300 && b > 1e300 && b.is_finite());
}

#[test]
fn range_empty_or_unusable() {
    assert_eq!(range(&[], false), (0.0, 1.0));
    assert_eq!(range(&[], true), (1.0, 10.0));
    assert_eq!(range(&[f64::NAN, f64::INFINITY], false), (0.0, 1.0));
    assert_eq!(range(&[0.0, -1.0, f64::NAN], true), (1.0, 10.0));
}

#[test]
fn range_extremes_stay_finite_and_ordered() {
    for (vals, log) in [
        (vec![f64::MAX, -f64::MAX], false),
        (vec![f64::MAX], false),
        (vec![f64::MIN_POSITIVE / 4.0, f64::MAX], true),
        (vec![1.0, 1.0 + 1e-15], false),
    ] {
        let (a, b) = range(&vals, log);
        assert!(a.is_finite() && b.is_finite() && a < b, "{vals:?}: {a} {b}");
        if log {
            assert!(a > 0.0);
        }
    }
}

#[test]
fn log_ticks_label_every_decade_or_fewer() {
    let (bold, light) = log_ticks(1e-6, 1e-3);
    assert_eq!(bold, vec![1e-6, 1e-5, 1e-4, 1e-3]);
    assert_eq!(light.len(), 3 * 8);
    let (bold, _) = log_ticks(100.0, 1000.0);
    assert_eq!(bold.len(), 10);
    assert_eq!((bold[0], bold[9]), (100.0, 1000.0));
    let (bold, _) = log_ticks(1.0, 100.0);
    assert_eq!(bold, vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
    let (bold, light) = log_ticks(1e-300, 1e300);
    assert!(bold.len() <= 11 && bold.len() >= 5, "{bold:?}");
    assert!(bold.iter().chain(&light).all(|v| v.is_finite() && *v > 0.0));
}

#[test]
fn tick_labels_are_short() {
    assert_eq!(fmt_tick(0.0), "0");
    assert_eq!(fmt_tick(1000.0), "1000");
    assert_eq!(fmt_tick(0.30000000000000004), "0.3");
    assert_eq!(fmt_tick(-2.5), "-2.5");
    assert_eq!(fmt_tick(1e6), "1e6");
    assert_eq!(fmt_tick(2.5e-7), "2.5e-7");
    assert_eq!(fmt_tick(0.001), "0.001");
}

#[test]
fn missing_font_error_names_paths() {
    let paths = [
        PathBuf::from("/nonexistent/a.ttf"),
        PathBuf::from("/nonexistent/b.ttf"),
    ];
    let msg = format!("{:#}", register_first_font(&paths).unwrap_err());
    assert!(
        msg.contains("/nonexistent/a.ttf") && msg.contains("/nonexistent/b.ttf"),
        "{msg}"
    );
    assert!(msg.contains(FONT_ENV), "{msg}");
}
