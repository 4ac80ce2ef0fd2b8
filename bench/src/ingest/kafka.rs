//! `--source kafka`: records produced to librdkafka's mock cluster, consumed,
//! transformed (with `--plugin`) and fanned out; records per server
//! CPU-second, with and without the plugin in the same run.

use super::*;

pub(super) struct KafkaRun {
    records: u64,
    wall_secs: f64,
    server_cpu: f64,
    delivered: u64,
    /// The subscriber's order check, passed.
    order: String,
}

/// Partitions of the topic; record `n` is produced to partition `n % PARTITIONS`.
pub(super) const PARTITIONS: i32 = 4;

pub(super) async fn kafka_run(
    a: &IngestArgs,
    brokers: &str,
    plugin: Option<&std::path::Path>,
) -> anyhow::Result<KafkaRun> {
    let target = Target::herald(&a.common.herald, &a.common.herald_args).await?;
    if let Some(p) = plugin {
        target.install_plugin(p).await?;
    }
    let sub = subscribe(target.addr, TENANT, "c", PARTITIONS as u64).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let source = serde_json::json!({"kind":"kafka","brokers":brokers,"topics":["ingest"],"start":"earliest"});
    let cpu0 = target.cpu_secs()?;
    let t0 = Instant::now();
    set_source(&target, source).await?;
    // Done when the reader's positions reach the end of every partition. The
    // mock cluster keeps a bounded log, so "earliest" may start above offset 0:
    // the figure counts the records the source actually read.
    let produced = if a.common.smoke { 2_000 } else { a.records };
    let records = loop {
        let v = target
            .admin_request("GET", &format!("/admin/v1/tenants/{TENANT}/source"), b"")
            .await?;
        let h = &v["health"];
        let at_end: u64 = h["position"]
            .as_str()
            .and_then(|p| serde_json::from_str::<std::collections::BTreeMap<String, u64>>(p).ok())
            .map_or(0, |m| m.values().sum());
        if at_end >= produced && h["lag"] == 0 {
            break h["records"].as_u64().unwrap_or(0);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("the source did not reach the end of the topic in 60 s: {v}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let wall_secs = t0.elapsed().as_secs_f64();
    let server_cpu = target.cpu_secs()? - cpu0;
    // Everything is published once the source has read it: what the policy
    // removed is final, and the subscriber has the rest to read.
    // The last batch may still be going through ingest when the positions
    // reach the end: read what the policy removed until the subscriber has
    // the rest, and once more for the verdict.
    let mut explained = slow_consumer_removals(&target).await?;
    let until = Instant::now() + Duration::from_secs(30);
    while sub.count.load(Ordering::Relaxed) + explained < records && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
        explained = slow_consumer_removals(&target).await?;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let explained = slow_consumer_removals(&target).await?;
    let delivered = sub.count.load(Ordering::Relaxed);
    sub.task.abort();
    let order = sub
        .order
        .lock()
        .expect("order lock")
        .verdict(records, explained);
    let order = match order {
        Ok(o) => o,
        Err(e) => {
            eprintln!("the server's counters:\n{}", tenant_counters(&target).await);
            bail!("kafka ingest: {e}")
        }
    };
    Ok(KafkaRun {
        records,
        wall_secs,
        server_cpu,
        delivered,
        order,
    })
}

pub(super) async fn kafka(a: &IngestArgs) -> anyhow::Result<()> {
    let cluster = MockCluster::new(1).context("starting the mock Kafka cluster")?;
    cluster.create_topic("ingest", PARTITIONS, 1)?;
    let brokers = cluster.bootstrap_servers();
    let records = if a.common.smoke { 2_000 } else { a.records };
    println!(
        "ingest kafka: producing {records} records of ~100 B to a mock cluster ({PARTITIONS} partitions)"
    );
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "2000000")
        .set("batch.num.messages", "10000")
        .create()?;
    const SYMS: [&str; 5] = ["AAPL", "MSFT", "GOOG", "AMZN", "NVDA"];
    let mut pending = Vec::with_capacity(10_000);
    for i in 0..records {
        let payload = format!(
            r#"{{"sym":"{}","px":{}.5,"n":{i},"t":{},"pad":"xxxxxxxxxxxxxxxxxxxxxxxxxxxx"}}"#,
            SYMS[(i % 5) as usize],
            100 + i % 50,
            now_nanos()
        );
        let headers = OwnedHeaders::new().insert(Header {
            key: "channel",
            value: Some("c"),
        });
        let rec = FutureRecord::<(), _>::to("ingest")
            .partition((i % PARTITIONS as u64) as i32)
            .payload(&payload)
            .headers(headers);
        pending.push(producer.send_result(rec).map_err(|(e, _)| e)?);
        if pending.len() == 10_000 {
            for f in pending.drain(..) {
                f.await?.map_err(|(e, _)| e)?;
            }
        }
    }
    for f in pending {
        f.await?.map_err(|(e, _)| e)?;
    }
    let with = kafka_run(a, &brokers, a.plugin.as_deref()).await?;
    let label = if a.plugin.is_some() {
        "with plugin"
    } else {
        "no plugin"
    };
    let rate = |r: &KafkaRun| r.records as f64 / r.server_cpu.max(0.01);
    println!(
        "  {label}: {} records in {:.2} s ({:.0}/s wall), server CPU {:.2} s -> {:.0} records per server CPU-second (target >= 200,000: {}); subscriber got {}",
        r_fmt(with.records),
        with.wall_secs,
        with.records as f64 / with.wall_secs,
        with.server_cpu,
        rate(&with),
        report::verdict(Some(rate(&with)), 200_000.0, false),
        with.delivered
    );
    println!("  {}", with.order);
    let mut line = serde_json::json!({
        "scenario": "ingest", "source": "kafka", "smoke": a.common.smoke, "commit": report::git_commit(), "date": report::utc_now(),
        "records": with.records, "plugin": a.plugin.as_ref().map(|p| p.display().to_string()),
        "records_per_server_cpu_sec": rate(&with), "wall_secs": with.wall_secs, "delivered": with.delivered,
    });
    if a.no_plugin_baseline && a.plugin.is_some() {
        let bare = kafka_run(a, &brokers, None).await?;
        println!(
            "  no plugin: {:.0} records per server CPU-second; with plugin / without = {:.2}x",
            rate(&bare),
            rate(&with) / rate(&bare)
        );
        line["no_plugin_records_per_server_cpu_sec"] = serde_json::json!(rate(&bare));
    }
    a.common.record(line)?;
    Ok(())
}
