//! A Kafka source's `options` never load code or read files on
//! the server. Only what tenants need is accepted (security protocol, SASL,
//! PEM bodies, verification, client id, timeouts); anything else is refused
//! by name before librdkafka sees it, and a stored source whose options no
//! longer pass (stored by an older Herald) stalls with the reason instead of
//! starting.

use crate::helpers::*;
use crate::outbox::wait_source;
use rdkafka::mocking::MockCluster;
use reqwest::Method;
use serde_json::{json, Value};

/// Sets `tenant`'s source to `body`: status and answer.
async fn put(h: &Host, tenant: &str, body: Value) -> (u16, Value) {
    let path = format!("/admin/v1/tenants/{tenant}/source");
    h.admin(Method::PUT, &path, Some(body)).await
}

fn message(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn options_that_load_code_or_read_files_are_refused_by_name() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("opts", 1, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let h = spawn_host().await;
    h.public_tenant("kopts-deny").await;
    // A shared object that records being loaded, were anything to load it.
    let dir = tempfile::tempdir().unwrap();
    let so = dir.path().join("x.so");
    std::fs::write(&so, b"not an ELF file").unwrap();
    let so = so.to_str().unwrap().to_string();
    for (name, value) in [
        ("ssl.providers", so.as_str()),
        ("ssl.engine.location", so.as_str()),
        ("plugin.library.paths", so.as_str()),
        ("ssl.ca.location", "/etc/shadow"),
        ("ssl.certificate.location", "/etc/shadow"),
        ("ssl.key.location", "/etc/shadow"),
        ("ssl.keystore.location", "/etc/shadow"),
        ("ssl.crl.location", "/etc/shadow"),
        ("sasl.kerberos.kinit.cmd", "touch /tmp/pwned"),
        ("sasl.kerberos.keytab", "/etc/krb5.keytab"),
        ("debug", "all"),
    ] {
        let body =
            json!({"kind":"kafka","brokers":brokers,"topics":["opts"],"options":{name: value}});
        let (s, v) = put(&h, "kopts-deny", body).await;
        assert_eq!(s, 400, "{name}: {v}");
        let m = message(&v);
        assert!(
            m.contains(&format!("{name:?}")) && m.contains("not an option"),
            "{name}: refused by name, before librdkafka: {v}"
        );
        let l = m.to_lowercase();
        assert!(
            !l.contains("openssl") && !l.contains("load"),
            "{name}: tried: {v}"
        );
    }
    // What tenants need still passes.
    let body = json!({"kind":"kafka","brokers":brokers,"topics":["opts"],
        "options":{"client.id":"c","socket.timeout.ms":5000,"ssl.endpoint.identification.algorithm":"https",
                   "enable.ssl.certificate.verification":true}});
    let (s, v) = put(&h, "kopts-deny", body).await;
    assert_eq!(s, 200, "{v}");
    h.stop().await;
}

/// A source stored with an option that is no longer accepted (an older
/// Herald took it) is not started: it stalls and says which option.
#[tokio::test]
async fn a_stored_source_with_a_refused_option_stalls_instead_of_starting() {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("opts-stored", 1, 1).unwrap();
    let brokers = cluster.bootstrap_servers();
    let h = spawn_host().await;
    h.public_tenant("kopts-stored").await;
    let body = json!({"kind":"kafka","brokers":brokers,"topics":["opts-stored"],"options":{"client.id":"c"}});
    let (s, v) = put(&h, "kopts-stored", body).await;
    assert_eq!(s, 200, "{v}");
    // An older Herald stored the option (written to the registry directly).
    let data_dir = h.data_dir.clone();
    let h = {
        let dir = h.stop().await;
        let db = format!(
            "sqlite://{}?mode=rw",
            data_dir.join("registry.db").display()
        );
        let pool = sqlx::SqlitePool::connect(&db).await.unwrap();
        let stored = json!({"kind":"kafka","brokers":brokers,"topics":["opts-stored"],
            "options":{"ssl.engine.location":"/tmp/x.so"}});
        sqlx::query("UPDATE tenants SET source = $1 WHERE id = 'kopts-stored'")
            .bind(stored.to_string())
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        let mut opts = HostOptions::new();
        opts.config.data_dir = data_dir;
        opts.dir = dir;
        spawn_with(opts).await
    };
    let v = wait_source(
        &h,
        "kopts-stored",
        |health| health["state"] == "stalled",
        "the source started with a refused option",
    )
    .await;
    let why = v["health"]["last_error"].as_str().unwrap_or_default();
    assert!(why.contains("\"ssl.engine.location\""), "{v}");
    h.stop().await;
}
