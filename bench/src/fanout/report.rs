//! What a fan-out run prints and draws: the latency plot, the smoke
//! checks, one outcome's lines, each round's ratios and their medians.

use super::*;

/// p50 and p99 against offered frames per second, one line each per server.
pub(super) fn draw_latency(
    all: &[Outcome],
    args: &FanoutArgs,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let mut series = Vec::new();
    let mut labels: Vec<&str> = Vec::new();
    for o in all {
        if !labels.contains(&o.label.as_str()) {
            labels.push(&o.label);
        }
    }
    for label in labels {
        for (pct, name) in [(50.0, "p50"), (99.0, "p99")] {
            let points = all
                .iter()
                .filter(|o| o.label == label)
                .filter_map(|o| {
                    // Every subscription receives `rate` messages per second.
                    let offered = o.rate
                        * args.subs as f64
                        * args.subs_per_conn.clamp(1, args.channels.max(1)) as f64;
                    Some((offered, o.latency().percentile(pct)? as f64 / 1000.0))
                })
                .collect();
            series.push(crate::plot::Series {
                name: format!("{label} {name}"),
                points,
            });
        }
    }
    crate::plot::draw(
        &crate::plot::Chart {
            title: format!(
                "fan-out latency: {} subscribers, {} channel(s), {} B",
                args.subs, args.channels, args.payload_bytes
            ),
            x_label: "offered frames per second".into(),
            y_label: "publish → receive latency (ms)".into(),
            log_x: true,
            log_y: true,
            series,
        },
        path,
    )
}

/// At smoke scale nothing may be lost: every queued frame arrives, in order.
pub(super) fn smoke_check(o: &Outcome) -> anyhow::Result<()> {
    let s = &o.stats;
    if o.publish_errors > 0
        || !o.drained
        || s.msgs != o.offered
        || s.gaps + s.backwards + s.bad + s.closed_early > 0
    {
        bail!(
            "{} smoke check failed: {} publish errors, {} of {} frames received, {} gaps, {} backwards, {} bad, {} closed early",
            o.label,
            o.publish_errors,
            s.msgs,
            o.offered,
            s.gaps,
            s.backwards,
            s.bad,
            s.closed_early
        );
    }
    if o.offered == 0 {
        bail!("{} smoke check failed: nothing was delivered", o.label);
    }
    Ok(())
}

pub(super) fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    if let (Some(a), serde_json::Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

pub(super) fn print_outcome(o: &Outcome) {
    let name = &o.label;
    let h = o.latency();
    println!("{name}:");
    println!(
        "  {} of {} subscribers connected over {} worker(s){}",
        fmt_int(o.ready.connected as u64),
        fmt_int((o.ready.connected + o.ready.failed) as u64),
        o.workers,
        o.ready
            .first_error
            .as_ref()
            .map(|e| format!(" (first error: {e})"))
            .unwrap_or_default()
    );
    println!(
        "  published {} msgs in {} requests over {:.1} s ({} errors{}); server queued/wrote {} frames{}",
        fmt_int(o.published),
        fmt_int(o.requests),
        o.publish_secs,
        o.publish_errors,
        o.first_publish_error.as_ref().map(|e| format!(": {e}")).unwrap_or_default(),
        fmt_int(o.offered),
        if o.dropped_by_server > 0 { format!(", dropped {} (socket full)", fmt_int(o.dropped_by_server)) } else { String::new() }
    );
    println!(
        "  received {} msg frames{}; server CPU {:.2} s over a {:.1} s window ({:.0}% of one core) -> {} frames per server CPU-second",
        fmt_int(o.stats.msgs),
        if o.drained { "" } else { " (delivery stalled or drain time ran out)" },
        o.server_cpu,
        o.window_secs,
        100.0 * o.server_cpu / o.window_secs.max(1e-9),
        fmt_rate(o.fps())
    );
    println!(
        "  {} bytes on the wire per msg frame received",
        crate::report::fmt_int(
            (o.stats.wire_bytes as f64 / o.stats.msgs.max(1) as f64).round() as u64
        )
    );
    if let Some(f) = o.frames_per_write {
        println!("  {f:.2} frames per socket write (herald counters)");
    }
    if let Some(h) = o.lagging_holds.filter(|h| *h > 0.0) {
        println!("  {h:.0} waits of writers holding off for lagging readers (herald counters)");
    }
    println!(
        "  latency publish->receive: p50 {}, p99 {}, p99.9 {}, max {}",
        fmt_ms(h.percentile(50.0)),
        fmt_ms(h.percentile(99.0)),
        fmt_ms(h.percentile(99.9)),
        fmt_ms((h.count() > 0).then(|| h.max()))
    );
    println!(
        "  seq check: {} gaps ({} positions missing), {} backwards, {} bad frames, {} connections closed early {:?}",
        o.stats.gaps, o.stats.missing, o.stats.backwards, o.stats.bad, o.stats.closed_early, o.stats.close_codes
    );
    let flag = if o.loadgen_cpu() > o.server_cpu {
        "  <-- FLAG: the load generator used more CPU than the server"
    } else {
        ""
    };
    println!(
        "  load generator CPU {:.2} s (parent {:.2}, workers {:.2}) = {} of the server's{flag}",
        o.loadgen_cpu(),
        o.parent_cpu,
        o.workers_cpu,
        fmt_ratio(ratio(o.loadgen_cpu(), o.server_cpu))
    );
    let busy = if o.machine_busy() {
        "  <-- WARNING: the machine was busy; CPU and latency figures are disturbed"
    } else {
        ""
    };
    println!(
        "  other processes used {:.2} CPU-s during the window (kernel softirq time included){busy}",
        o.foreign_cpu
    );
}

/// Prints Herald's ratio to every other server of one round (frames per
/// server CPU-second, and bytes per frame between compressing servers) and
/// returns them by label.
pub(super) fn summarize(
    rate: f64,
    outcomes: &[Outcome],
    load: Load,
) -> serde_json::Map<String, serde_json::Value> {
    let mut ratios = serde_json::Map::new();
    println!("summary at {rate} msg/s per channel:");
    let per_frame = |o: &Outcome| o.stats.wire_bytes as f64 / o.stats.msgs.max(1) as f64;
    let Some(h) = outcomes.iter().find(|o| o.label == "herald") else {
        return ratios;
    };
    for o in outcomes.iter().filter(|o| o.label != "herald") {
        let r = ratio(h.fps().unwrap_or(f64::NAN), o.fps().unwrap_or(f64::NAN));
        let target = target_ratio(&o.label, load);
        println!(
            "  herald / {} = {} frames per server CPU-second ({} vs {}); p99 {} vs {}{}",
            o.label,
            fmt_ratio(r),
            fmt_rate(h.fps()),
            fmt_rate(o.fps()),
            fmt_ms(h.latency().percentile(99.0)),
            fmt_ms(o.latency().percentile(99.0)),
            target
                .map(|t| format!("; target ≥ {t}×: {}", verdict(r, t, false)))
                .unwrap_or_default()
        );
        ratios.insert(o.label.clone(), r.into());
        if o.label == "herald-deflate" {
            println!(
                "  herald-deflate / herald = {} bytes on the wire per frame ({:.0} vs {:.0} B)",
                fmt_ratio(ratio(per_frame(o), per_frame(h))),
                per_frame(o),
                per_frame(h),
            );
        }
    }
    let deflating = outcomes.iter().find(|o| o.label == "herald-deflate");
    let uws_deflating = outcomes.iter().find(|o| o.label == "uwebsockets-deflate");
    if let (Some(d), Some(u)) = (deflating, uws_deflating) {
        let r = ratio(d.fps().unwrap_or(f64::NAN), u.fps().unwrap_or(f64::NAN));
        println!(
            "  herald-deflate / uwebsockets-deflate = {} frames per server CPU-second ({} vs {}), bytes per frame {:.0} vs {:.0} B",
            fmt_ratio(r),
            fmt_rate(d.fps()),
            fmt_rate(u.fps()),
            per_frame(d),
            per_frame(u),
        );
        ratios.insert("deflate:uwebsockets-deflate".into(), r.into());
    }
    ratios
}

/// Each label's ratio in every round and the median of them.
pub(super) fn print_medians(
    rate: f64,
    pairs: &[serde_json::Map<String, serde_json::Value>],
    load: Load,
) {
    println!(
        "same-run pairs at {rate} msg/s per channel ({} rounds):",
        pairs.len()
    );
    let mut labels: Vec<&String> = pairs.iter().flat_map(|p| p.keys()).collect();
    labels.sort();
    labels.dedup();
    for label in labels {
        let mut rs: Vec<f64> = pairs
            .iter()
            .filter_map(|p| p.get(label.as_str()).and_then(|v| v.as_f64()))
            .collect();
        let each = rs
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        let median = median(&mut rs);
        let target = target_ratio(label, load);
        println!(
            "  herald / {label}: {each}; median {}{}",
            median.map_or("n/a".into(), |m| format!("{m:.2}×")),
            target
                .map(|t| format!("; target ≥ {t}×: {}", verdict(median, t, false)))
                .unwrap_or_default()
        );
    }
}

/// The median of `xs` (the lower middle one for an even count).
pub fn median(xs: &mut Vec<f64>) -> Option<f64> {
    xs.retain(|x| x.is_finite());
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(xs[(xs.len() - 1) / 2])
}
