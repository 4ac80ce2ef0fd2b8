//! Driving one server through a fan-out run: starting it, publishing the
//! plan, waiting for the subscribers to drain; one round over every server.

use super::*;

/// Starts a server of `kind` (Herald with `plugin` active, if given).
pub async fn start(
    kind: Kind,
    c: &CommonArgs,
    plugin: Option<&std::path::Path>,
) -> anyhow::Result<Target> {
    start_bin(kind, c, plugin, &c.herald).await
}

/// [`start`] with Herald from `bin`.
pub(super) async fn start_bin(
    kind: Kind,
    c: &CommonArgs,
    plugin: Option<&std::path::Path>,
    bin: &std::path::Path,
) -> anyhow::Result<Target> {
    match kind {
        Kind::Herald => {
            let t = Target::herald(bin, &c.herald_args).await?;
            if let Some(p) = plugin {
                t.install_plugin(p).await?;
            }
            Ok(t)
        }
        Kind::Raw => Target::raw().await,
        Kind::Nchan => Target::peer(Peer::Nchan).await,
        Kind::Python => Target::peer(Peer::Python).await,
        Kind::Uws => Target::peer(Peer::Uws).await,
    }
}

pub(super) async fn one(
    args: &FanoutArgs,
    plan: &Plan,
    srv: &Server<'_>,
    split: bool,
    deadline: Instant,
) -> anyhow::Result<Outcome> {
    let c = &args.common;
    let kind = srv.kind;
    // Kept for the server's life: its publish topic lives in it.
    let mut _kafka = None;
    let mut server = match (srv.nodes, &args.cluster_db) {
        (Some(n), Some(db)) => {
            let mut extra = c.herald_args.clone();
            if args.cluster_kafka_mock {
                let mock = rdkafka::mocking::MockCluster::new(1)
                    .context("starting the Kafka mock cluster")?;
                mock.create_topic(&format!("herald.publish.{}", crate::target::TENANT), 1, 1)
                    .context("creating the publish topic")?;
                extra.extend(["--cluster-kafka".to_string(), mock.bootstrap_servers()]);
                _kafka = Some(mock);
            }
            let t = Target::herald_cluster(&c.herald, &extra, n, db).await?;
            if let Some(p) = srv.plugin {
                t.install_plugin(p).await?;
            }
            t
        }
        _ => match srv.deflate {
            Some(_) if kind == Kind::Uws => Target::uws(true).await?,
            Some(min) => {
                let mut extra = c.herald_args.clone();
                extra.extend(["--deflate-min-bytes".to_string(), min.to_string()]);
                let t = Target::herald(srv.bin.unwrap_or(&c.herald), &extra).await?;
                if let Some(p) = srv.plugin {
                    t.install_plugin(p).await?;
                }
                t
            }
            None => start_bin(kind, c, srv.plugin, srv.bin.unwrap_or(&c.herald)).await?,
        },
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let spec = PoolSpec {
        channels: plan.channels,
        subs_per_conn: args.subs_per_conn,
        connect_concurrency: c.connect_concurrency,
        deflate: srv.deflate.is_some(),
        ..PoolSpec::new(&server, args.transport, left + Duration::from_secs(5))
    };
    let mut pool = Pool::spawn(&spec, args.subs, c.max_per_worker, c.workers)?;
    let ready = pool.ready(left).await?;
    if ready.connected == 0 {
        bail!(
            "{}: no subscriber connected: {:?}",
            kind.as_str(),
            ready.first_error
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    let counters0 = server.write_counters().await;
    let me = std::process::id();
    let (s0, p0, w0) = (server.cpu_secs()?, procs::cpu_secs(me)?, pool.cpu_secs());
    let m0 = procs::machine_busy_secs()?;
    let t0 = Instant::now();

    let sent = publish_plan(&server, plan, split, deadline).await?;
    let publish_secs = t0.elapsed().as_secs_f64();
    // A cluster answers once the log has the message, before any node
    // delivered it: what is offered is every subscription of its channel.
    let offered = match srv.nodes {
        Some(_) => {
            let subscriptions =
                ready.connected as u64 * args.subs_per_conn.clamp(1, plan.channels) as u64;
            sent.messages * subscriptions / plan.channels as u64
        }
        None => sent.delivered,
    };
    let drained = drain(&mut pool, offered, args.drain_secs, deadline).await?;
    let window_secs = t0.elapsed().as_secs_f64();
    let (s1, p1, w1) = (server.cpu_secs()?, procs::cpu_secs(me)?, pool.cpu_secs());
    let m1 = procs::machine_busy_secs()?;
    let foreign_cpu = ((m1 - m0) - (s1 - s0) - (p1 - p0) - (w1 - w0)).max(0.0);
    let counters1 = server.write_counters().await;
    let rss_kib = server.memory_kib().map(|m| m.0).unwrap_or(0);
    let (stats, _) = pool.stop().await?;
    server.check_alive()?;
    let frames_per_write = match (counters0, counters1) {
        (Some((f0, w0, _)), Some((f1, w1, _))) => ratio(f1 - f0, w1 - w0),
        _ => None,
    };
    let lagging_holds = match (counters0, counters1) {
        (Some((_, _, h0)), Some((_, _, h1))) => Some(h1 - h0),
        _ => None,
    };
    Ok(Outcome {
        kind,
        label: srv.label.clone(),
        rate: plan.rate,
        ready,
        workers: pool.len(),
        requests: sent.requests,
        published: sent.messages,
        publish_errors: sent.errors,
        first_publish_error: sent.first_error,
        offered,
        dropped_by_server: sent.dropped,
        publish_secs,
        window_secs,
        drained,
        server_cpu: s1 - s0,
        parent_cpu: p1 - p0,
        workers_cpu: w1 - w0,
        foreign_cpu,
        frames_per_write,
        lagging_holds,
        stats,
        rss_kib,
    })
}

/// Publishes `plan` on one keep-alive connection, on its fixed schedule.
pub async fn publish_plan(
    server: &Target,
    plan: &Plan,
    split: bool,
    deadline: Instant,
) -> anyhow::Result<Published> {
    let t0 = Instant::now();
    let mut http = server.publisher();
    let mut counters = Vec::new();
    let mut sent = Published::default();
    let rounds = plan.requests();
    let mut shown = Instant::now();
    for i in 0..rounds {
        tokio::time::sleep_until((t0 + plan.period().mul_f64(i as f64)).into()).await;
        if shown.elapsed() >= PROGRESS_EVERY {
            shown = Instant::now();
            println!(
                "  … {:.0} s: {} of {} rounds published, {} frames queued by the server",
                t0.elapsed().as_secs_f64(),
                fmt_int(i),
                fmt_int(rounds),
                fmt_int(sent.delivered)
            );
        }
        let msgs = plan.messages(now_nanos(), &mut counters);
        sent.add(server.publish(&mut http, &msgs, split).await);
        if Instant::now() > deadline {
            bail!("overall deadline reached while publishing");
        }
    }
    Ok(sent)
}

/// How often a long step shows where it is.
pub(super) const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Waits until the pool has received `expected` msg frames (true), or
/// delivery stalls for 2 s, or `drain_secs` or the deadline pass (false).
pub async fn drain(
    pool: &mut Pool,
    expected: u64,
    drain_secs: f64,
    deadline: Instant,
) -> anyhow::Result<bool> {
    let until = Instant::now() + Duration::from_secs_f64(drain_secs);
    let (mut last, mut last_change) = (0, Instant::now());
    let mut shown = Instant::now();
    loop {
        let msgs = pool.progress().await?.msgs;
        if msgs >= expected {
            return Ok(true);
        }
        if shown.elapsed() >= PROGRESS_EVERY {
            shown = Instant::now();
            println!(
                "  … draining: {} of {} frames received",
                fmt_int(msgs),
                fmt_int(expected)
            );
        }
        if msgs != last {
            last = msgs;
            last_change = Instant::now();
        }
        if last_change.elapsed() > Duration::from_secs(2)
            || Instant::now() > until
            || Instant::now() > deadline
        {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One turn of every server that has not broken yet at this plan's rate.
pub(super) async fn round_at(
    args: &FanoutArgs,
    plan: &Plan,
    servers: &[Server<'_>],
    broken: &mut [bool],
    split: bool,
    deadline: Instant,
) -> anyhow::Result<Vec<Outcome>> {
    let rate = plan.rate;
    let mut outcomes: Vec<Outcome> = Vec::new();
    for (i, srv) in servers.iter().enumerate() {
        if broken[i] {
            continue;
        }
        println!("{} at {rate} msg/s per channel:", srv.label);
        let o = one(args, plan, srv, split, deadline).await?;
        print_outcome(&o);
        let lost = o.offered.saturating_sub(o.stats.msgs) + o.dropped_by_server;
        let slip = o.publish_secs / args.duration_secs;
        if breaks(
            o.drained,
            lost,
            o.latency().percentile(99.0),
            args.break_p99_ms,
            slip,
        ) {
            println!(
                "  {} breaks at {rate} msg/s per channel (lost or late frames, p99 over {} ms, or publishing took {slip:.1}× the planned time)",
                srv.label, args.break_p99_ms
            );
            broken[i] = true;
        }
        outcomes.push(o);
    }
    Ok(outcomes)
}
