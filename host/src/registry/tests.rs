//! Schema tests, run against SQLite always and against Postgres when
//! `HERALD_TEST_POSTGRES_URL` names a throwaway database (the test script
//! starts one).

use super::*;

fn record(id: &str) -> TenantRecord {
    TenantRecord {
        id: id.into(),
        access: "public".into(),
        config: serde_json::json!({"a": 1}),
        limits: serde_json::json!({"queue_bytes": 100000}),
        publish_key_sha256: "00".repeat(32),
        created_at_ms: 1,
        updated_at_ms: 1,
        active_plugin: None,
        conflation: serde_json::json!({}),
        source: serde_json::json!({"kind": "http"}),
        allowed_origins: serde_json::json!(["https://app.example"]),
    }
}

async fn exercise(reg: &Registry, prefix: &str) {
    let a = record(&format!("{prefix}a"));
    reg.create_tenant(&a).await.unwrap();
    assert!(matches!(
        reg.create_tenant(&a).await,
        Err(RegistryError::Conflict(_))
    ));
    assert_eq!(reg.get_tenant(&a.id).await.unwrap(), a);
    let mut changed = a.clone();
    changed.access = "plugin".into();
    changed.updated_at_ms = a.updated_at_ms + 1;
    assert!(reg
        .update_tenant_if(&changed, a.updated_at_ms)
        .await
        .unwrap());
    assert_eq!(reg.get_tenant(&a.id).await.unwrap().access, "plugin");
    // Written over what it read: refused, nothing changed.
    let mut stale = a.clone();
    stale.access = "public".into();
    stale.updated_at_ms = a.updated_at_ms + 2;
    assert!(!reg.update_tenant_if(&stale, a.updated_at_ms).await.unwrap());
    assert_eq!(reg.get_tenant(&a.id).await.unwrap().access, "plugin");
    assert!(reg
        .list_tenants()
        .await
        .unwrap()
        .iter()
        .any(|t| t.id == a.id));
    let gone = record(&format!("{prefix}zz"));
    assert!(matches!(
        reg.update_tenant_if(&gone, gone.updated_at_ms - 1).await,
        Err(RegistryError::NotFound(_))
    ));
    // A publish key: claimed once at a time, its receipt kept, then taken by
    // the next attempt; gone with the tenant.
    let claim = |hold| reg.claim_receipt(&a.id, "k", "[null]", hold, 60_000);
    assert_eq!(claim(30_000).await.unwrap(), Claim::Ours(None));
    assert_eq!(claim(30_000).await.unwrap(), Claim::InFlight);
    reg.settle_receipt(&a.id, "k", "[1]").await.unwrap();
    assert_eq!(claim(0).await.unwrap(), Claim::Ours(Some("[1]".into())));
    // A hold that ran out (the attempt's process died) is taken over.
    assert_eq!(claim(0).await.unwrap(), Claim::Ours(Some("[1]".into())));
    // Past the keep, a key is new again.
    assert_eq!(
        reg.claim_receipt(&a.id, "k", "[null]", 0, -1)
            .await
            .unwrap(),
        Claim::Ours(None)
    );
    reg.delete_tenant(&a.id).await.unwrap();
    assert_eq!(
        claim(0).await.unwrap(),
        Claim::Ours(None),
        "deleted with the tenant"
    );
    assert!(matches!(
        reg.delete_tenant(&a.id).await,
        Err(RegistryError::NotFound(_))
    ));
    assert!(matches!(
        reg.get_tenant(&a.id).await,
        Err(RegistryError::NotFound(_))
    ));
    // Plugin versions number up from 1 per tenant and follow the tenant out.
    let b = record(&format!("{prefix}b"));
    reg.create_tenant(&b).await.unwrap();
    let p = PluginRecord {
        tenant_id: b.id.clone(),
        version: 0,
        sha256: "ab".repeat(32),
        size_bytes: 3,
        name: "n".into(),
        plugin_version: "1".into(),
        hooks: serde_json::json!({"transform": true}),
        created_at_ms: 1,
    };
    assert_eq!(reg.add_plugin(&p, &[1, 2, 3]).await.unwrap(), 1);
    assert_eq!(reg.add_plugin(&p, &[4, 5]).await.unwrap(), 2);
    assert_eq!(reg.plugin_component(&b.id, 2).await.unwrap(), vec![4, 5]);
    assert_eq!(reg.list_plugins(&b.id).await.unwrap().len(), 2);
    reg.set_active_plugin(&b.id, Some(2)).await.unwrap();
    assert_eq!(reg.get_tenant(&b.id).await.unwrap().active_plugin, Some(2));
    assert!(matches!(
        reg.plugin_component(&b.id, 9).await,
        Err(RegistryError::NotFound(_))
    ));
    let orphan = PluginRecord {
        tenant_id: format!("{prefix}none"),
        ..p.clone()
    };
    assert!(matches!(
        reg.add_plugin(&orphan, &[1]).await,
        Err(RegistryError::NotFound(_))
    ));
    reg.delete_tenant(&b.id).await.unwrap();
    assert!(reg.list_plugins(&b.id).await.unwrap().is_empty());

    // Sources and per-node cursors.
    let c = record(&format!("{prefix}c"));
    reg.create_tenant(&c).await.unwrap();
    assert_eq!(
        reg.get_tenant(&c.id).await.unwrap().source,
        serde_json::json!({"kind": "http"})
    );
    let src = serde_json::json!({"kind": "postgres_outbox", "table": "t"});
    reg.set_source(&c.id, &src).await.unwrap();
    assert_eq!(reg.get_tenant(&c.id).await.unwrap().source, src);
    assert_eq!(reg.cursor(&c.id, "n1", "outbox:t").await.unwrap(), None);
    reg.put_cursor(&c.id, "n1", "outbox:t", "41").await.unwrap();
    reg.put_cursor(&c.id, "n1", "outbox:t", "42").await.unwrap();
    reg.put_cursor(&c.id, "n2", "outbox:t", "7").await.unwrap();
    assert_eq!(
        reg.cursor(&c.id, "n1", "outbox:t")
            .await
            .unwrap()
            .as_deref(),
        Some("42")
    );
    assert_eq!(
        reg.cursor(&c.id, "n2", "outbox:t")
            .await
            .unwrap()
            .as_deref(),
        Some("7")
    );

    let key = format!("{prefix}k");
    assert_eq!(reg.get_setting(&key).await.unwrap(), None);
    reg.put_setting(&key, "v1").await.unwrap();
    reg.put_setting(&key, "v2").await.unwrap();
    assert_eq!(reg.get_setting(&key).await.unwrap().as_deref(), Some("v2"));
}

#[tokio::test]
async fn sqlite_schema_works_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::open(None, dir.path()).await.unwrap();
    assert_eq!(reg.backend(), Backend::Sqlite);
    exercise(&reg, "s").await;
    reg.create_tenant(&record("kept")).await.unwrap();
    reg.close().await;
    let again = Registry::open(None, dir.path()).await.unwrap();
    assert_eq!(
        again.get_tenant("kept").await.unwrap().config,
        serde_json::json!({"a": 1})
    );
}

#[tokio::test]
async fn postgres_schema_works() {
    let Ok(url) = std::env::var("HERALD_TEST_POSTGRES_URL") else {
        if std::env::var("HERALD_REQUIRE_POSTGRES").is_ok() {
            panic!("HERALD_REQUIRE_POSTGRES is set but HERALD_TEST_POSTGRES_URL is not");
        }
        eprintln!("skipping: HERALD_TEST_POSTGRES_URL not set");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::open(Some(&url), dir.path()).await.unwrap();
    assert_eq!(reg.backend(), Backend::Postgres);
    let prefix = format!("p{}-", rand::random::<u32>());
    exercise(&reg, &prefix).await;
}
