//! compose.yaml and the Dockerfile rehearsed without a Docker engine: the
//! herald service runs as the image would run it (the Dockerfile's `ENV`,
//! `ENTRYPOINT` and `CMD`, then the service's environment, no flags), on
//! this machine's stand-ins for the other services — the test PostgreSQL
//! with the init script the postgres service mounts, librdkafka's mock
//! cluster with the topic kafka-init creates. The healthcheck's request
//! must answer 200, the setup script the setup service runs must create
//! both tenants, and a tick as the ticker produces it and an order as the
//! orders service inserts it must reach subscribers. Only host names are
//! changed (postgres, kafka, herald → loopback), and the image's paths.

use crate::dashboard::{env_var, read, yaml};
use crate::helpers::*;
use crate::outbox::pg_url;
use rdkafka::producer::FutureRecord;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The Dockerfile's last stage: its `ENV` pairs and `ENTRYPOINT` + `CMD`.
fn dockerfile() -> (Vec<(String, String)>, Vec<String>) {
    let text = read("Dockerfile");
    let last = text.rsplit("\nFROM ").next().unwrap();
    let mut env = Vec::new();
    let mut command = Vec::new();
    for line in last.lines() {
        if let Some(pairs) = line.strip_prefix("ENV ") {
            for kv in pairs.split_whitespace() {
                let (k, v) = kv.split_once('=').expect("ENV KEY=value");
                env.push((k.to_string(), v.to_string()));
            }
        }
        for word in ["ENTRYPOINT ", "CMD "] {
            if let Some(list) = line.strip_prefix(word) {
                let list: Vec<String> = serde_json::from_str(list).expect("exec form");
                command.extend(list);
            }
        }
    }
    (env, command)
}

/// `service`'s environment as pairs, `${VAR:?…}` left for the caller.
fn environment(service: &Value) -> Vec<(String, String)> {
    let keys: Vec<String> = match &service["environment"] {
        Value::Object(m) => m.keys().cloned().collect(),
        other => panic!("environment as a map: {other}"),
    };
    keys.into_iter()
        .map(|k| {
            let v = env_var(service, &k).unwrap();
            (k, v)
        })
        .collect()
}

#[tokio::test]
async fn the_compose_stack_runs_as_written_on_this_machines_services() {
    let Some(base) = pg_url() else {
        return;
    };
    let compose = yaml("compose.yaml");
    let services = &compose["services"];

    // postgres: a database of its own, with the init scripts it mounts.
    let admin = sqlx::PgPool::connect(&base).await.unwrap();
    let db = format!("herald_compose_{:08x}", rand::random::<u32>());
    sqlx::raw_sql(&format!("CREATE DATABASE {db}"))
        .execute(&admin)
        .await
        .unwrap();
    let (root, _) = base.rsplit_once('/').unwrap();
    let database_url = format!("{root}/{db}");
    let pg = sqlx::PgPool::connect(&database_url).await.unwrap();
    let mut inits = 0;
    for mount in services["postgres"]["volumes"].as_array().unwrap() {
        let mount = mount.as_str().unwrap();
        if let Some((src, dst)) = mount.strip_prefix("./").and_then(|m| m.split_once(':')) {
            if dst.starts_with("/docker-entrypoint-initdb.d/") {
                sqlx::raw_sql(&read(src)).execute(&pg).await.unwrap();
                inits += 1;
            }
        }
    }
    assert_eq!(inits, 1, "the outbox table's script");

    // kafka, kafka-init: the topic it creates, with its partitions.
    let init: Vec<String> =
        serde_json::from_value(services["kafka-init"]["entrypoint"].clone()).unwrap();
    let after = |flag: &str| init[init.iter().position(|a| a == flag).unwrap() + 1].clone();
    let (topic, partitions) = (after("--topic"), after("--partitions").parse().unwrap());
    let kafka = rdkafka::mocking::MockCluster::new(1).unwrap();
    kafka.create_topic(&topic, partitions, 1).unwrap();
    let brokers = kafka.bootstrap_servers();

    // herald: the image's environment, the service's over it, hosts mapped.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let data = tempfile::tempdir().unwrap();
    let herald_url = format!("http://127.0.0.1:{port}");
    let compose_db = env_var(&services["herald"], "HERALD_DATABASE_URL").unwrap();
    let map = |v: &str| -> String {
        v.replace(&compose_db, &database_url)
            .replace("0.0.0.0:8080", &format!("127.0.0.1:{port}"))
            .replace("http://herald:8080", &herald_url)
            .replace("kafka:9092", &brokers)
            .replace("/var/lib/herald", data.path().to_str().unwrap())
    };
    let (image_env, command) = dockerfile();
    assert_eq!(command, ["herald", "serve"]);
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"));
    cmd.args(&command[1..])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap())
        .kill_on_drop(true);
    for (k, v) in image_env.iter().chain(&environment(&services["herald"])) {
        let v = if v.starts_with("${HERALD_ADMIN_TOKEN") {
            ADMIN.to_string()
        } else {
            map(v)
        };
        cmd.env(k, v);
    }
    let mut herald = cmd.spawn().unwrap();

    // Its healthcheck: a raw HTTP/1.0 GET /readyz answering 200.
    let healthy = async {
        loop {
            if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                s.write_all(b"GET /readyz HTTP/1.0\r\n\r\n").await.unwrap();
                let mut answer = String::new();
                let _ = s.read_to_string(&mut answer).await;
                if answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200") {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), healthy)
        .await
        .expect("the healthcheck passes");

    // setup: the script it mounts, with its environment.
    let setup = &services["setup"];
    let script = setup["volumes"][0].as_str().unwrap();
    let script = script
        .strip_prefix("./")
        .unwrap()
        .split(':')
        .next()
        .unwrap();
    let mapped = data.path().join("setup.sh");
    std::fs::write(&mapped, map(&read(script))).unwrap();
    let mut sh = tokio::process::Command::new("sh");
    sh.arg(&mapped).env("PATH", std::env::var("PATH").unwrap());
    for (k, v) in environment(setup) {
        let v = if v.starts_with("${HERALD_ADMIN_TOKEN") {
            ADMIN.to_string()
        } else {
            map(&v)
        };
        sh.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), sh.output())
        .await
        .expect("the setup script ends")
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !said.contains("\"error\""),
        "{said}"
    );

    // Both sources read (the Kafka one starts at the latest offset: a tick
    // produced before it is live is not for it).
    let http = reqwest::Client::new();
    for t in ["ticks", "orders"] {
        let url = format!("{herald_url}/admin/v1/tenants/{t}/source");
        let live = async {
            loop {
                let v: Value = http
                    .get(&url)
                    .bearer_auth(ADMIN)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if v["health"]["state"] == "live" {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), live)
            .await
            .unwrap_or_else(|_| panic!("{t}'s source live"));
    }

    // A subscriber of each example, then a tick as the ticker produces it
    // (key `ticks.<SYM>`, a JSON value) and an order as the orders service
    // inserts it.
    let ticker = services["ticker"]["entrypoint"].to_string();
    assert!(
        ticker.contains("ticks.$$s|")
            && ticker.contains("parse.key=true")
            && ticker.contains(&format!("--topic {topic}")),
        "the ticker's records: {ticker}"
    );
    let ws_url = |t: &str| format!("ws://127.0.0.1:{port}/v1/t/{t}/ws");
    let mut ticks = ws_at(&ws_url("ticks")).await.expect("ticks");
    ticks.sub("ticks.AAPL", 1).await;
    let mut orders = ws_at(&ws_url("orders")).await.expect("orders");
    orders.sub("orders", 1).await;
    crate::kafka::test_producer(&brokers)
        .send(
            FutureRecord::to(&topic)
                .key("ticks.AAPL")
                .payload(r#"{"sym":"AAPL","px":123.45}"#),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    let m = next_op(&mut ticks, "msg", Duration::from_secs(20)).await;
    assert_eq!(m["data"], json!({"sym":"AAPL","px":123.45}), "{m}");

    let entry = services["orders"]["entrypoint"][2].as_str().unwrap();
    let insert = entry
        .lines()
        .find_map(|l| l.trim().strip_prefix('"'))
        .expect("the orders' INSERT")
        .trim_end_matches('"')
        .replace("\\\"", "\"")
        .replace("$$i", "1")
        .replace("$$((RANDOM % 500))", "42");
    sqlx::raw_sql(&insert).execute(&pg).await.unwrap();
    let m = next_op(&mut orders, "msg", Duration::from_secs(20)).await;
    assert_eq!(m["data"], json!({"order": 1, "total": 42}), "{m}");

    let _ = herald.kill().await;
    pg.close().await;
    let _ = sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .execute(&admin)
        .await;
}
