//! Ingest sources: where a tenant's records come from, and their health.
//!
//! Owns: the source configuration a tenant chose (`http`, `postgres_outbox`,
//! `kafka`; in cluster mode `http` reads the shared publish log),
//! starting and stopping the task that reads it, and the health every source
//! reports (state, last record, lag, errors). Invariants: one source task per
//! tenant; changing the source ends the old task (asked to stop, aborted
//! after [`STOP_GRACE`]) before the new one starts, one change at a time;
//! a change of state (live ↔ stalled) reaches every session of the tenant as
//! a `status` frame, and a session that connects while the source is stalled
//! learns it at once — "connected but silent" is always visible.

mod redact;
pub use redact::redact_url;
mod config;
pub mod kafka;
pub mod outbox;
pub use config::{generation_suffix, SourceConfig};

use crate::clock::now_ms;
use crate::proto;
use crate::registry::cursors::CursorStore;
use crate::registry::log::SharedLog;
use crate::tenant::Tenant;
use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What a reader needs of the node it runs on, and nothing else: where its
/// positions are stored (the registry's cursors), the node's name (part of
/// every cursor's key), cluster mode's shared log, and the node's stop token
/// and task tracker (every reader is a child of them).
pub struct SourceContext {
    pub cursors: CursorStore,
    /// Cluster mode: `http` tenants read the shared publish log.
    pub log: Option<Arc<SharedLog>>,
    /// Cluster mode with `--cluster-kafka`: `http` tenants' publish topics.
    pub log_kafka: Option<ClusterKafka>,
    pub shutdown: CancellationToken,
    pub tracker: TaskTracker,
}

/// Every tenant's running source, keyed by tenant id: a tenant deleted and
/// made again under the same id finds the slot (and the turn) of the one
/// before, so its new reader starts only after the old one has ended.
pub struct Sources {
    pub ctx: Arc<SourceContext>,
    slots: Mutex<HashMap<Box<str>, SourceSlot>>,
}

pub use crate::registry::log::ClusterKafka;

/// A source's state as clients see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SourceState {
    Starting,
    Live,
    Stalled,
}

impl SourceState {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceState::Starting => "starting",
            SourceState::Live => "live",
            SourceState::Stalled => "stalled",
        }
    }
}

/// What a source reports about itself.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Health {
    #[schema(value_type = String)]
    pub kind: &'static str,
    pub state: SourceState,
    /// When the current state began (ms since the Unix epoch).
    pub since_ms: u64,
    pub last_record_ms: Option<u64>,
    /// Records the source holds beyond this node's position.
    pub lag: Option<u64>,
    /// This node's position in the source.
    pub position: Option<String>,
    /// Kafka: how many partitions this node reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub partitions: Option<usize>,
    pub records: u64,
    pub errors: u64,
    pub last_error: Option<String>,
    /// Messages published at the channel's next position because their
    /// source position was behind it (ARCHITECTURE.md, "Positions"): several
    /// Kafka partitions into one channel, or outbox rows out of id order.
    pub rebased: u64,
    /// The tenant's rebased count when this source started (`rebased` is
    /// counted by ingest on the tenant; this source's share is the rest).
    #[serde(skip)]
    rebased_from: u64,
    /// Outbox: rows already committed that wait behind a transaction still
    /// open (part of `lag`; delivered, in order, once it ends).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub held_back: Option<u64>,
    /// Outbox: how long the oldest transaction holding rows back has been open.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(required = false)]
    pub oldest_open_xact_ms: Option<u64>,
}

impl Health {
    fn new(kind: &'static str) -> Health {
        Health {
            kind,
            state: if kind == "http" {
                SourceState::Live
            } else {
                SourceState::Starting
            },
            since_ms: now_ms() as u64,
            last_record_ms: None,
            lag: None,
            position: None,
            partitions: None,
            records: 0,
            errors: 0,
            last_error: None,
            rebased: 0,
            rebased_from: 0,
            held_back: None,
            oldest_open_xact_ms: None,
        }
    }
}

impl Sources {
    pub fn new(ctx: SourceContext) -> Sources {
        Sources {
            ctx: Arc::new(ctx),
            slots: Mutex::default(),
        }
    }

    /// The tenant's slot (an empty `http` one until a source starts).
    /// (A lookup on the publish path: the id is copied only for a new slot.)
    pub fn slot(&self, tenant: &str) -> MappedMutexGuard<'_, SourceSlot> {
        MutexGuard::map(self.slots.lock(), |m| {
            if !m.contains_key(tenant) {
                m.insert(tenant.into(), SourceSlot::default());
            }
            m.get_mut(tenant).expect("inserted above")
        })
    }

    /// The source's configuration and health as the API shows them.
    pub fn view(&self, tenant: &Tenant) -> (SourceConfig, Health) {
        let slot = self.slot(&tenant.id);
        let mut health = slot.health.lock().clone();
        health.rebased = tenant
            .rebased
            .load(Ordering::Relaxed)
            .saturating_sub(health.rebased_from);
        (slot.config.clone(), health)
    }

    /// The source's kind and, for Kafka, the publisher HTTP publishes go through.
    pub fn publish_route(
        &self,
        tenant: &str,
    ) -> (&'static str, Option<Arc<kafka::produce::Publisher>>) {
        let slot = self.slot(tenant);
        (slot.config.kind(), slot.publisher.clone())
    }

    fn health(&self, tenant: &str) -> Option<Arc<Mutex<Health>>> {
        self.slots.lock().get(tenant).map(|s| s.health.clone())
    }
}

/// The running source of a tenant.
pub struct SourceSlot {
    pub config: SourceConfig,
    pub health: Arc<Mutex<Health>>,
    /// Kafka: HTTP publishes are produced into the topic (made on first use).
    pub publisher: Option<Arc<kafka::produce::Publisher>>,
    stop: CancellationToken,
    done: Option<tokio::task::JoinHandle<()>>,
    /// Held for the whole of a change (`start`): one change at a time.
    turn: Arc<tokio::sync::Mutex<()>>,
}

impl Default for SourceSlot {
    fn default() -> Self {
        SourceSlot {
            config: SourceConfig::default(),
            health: Arc::new(Mutex::new(Health::new("http"))),
            publisher: None,
            stop: CancellationToken::new(),
            done: None,
            turn: Arc::default(),
        }
    }
}

/// How long a stopped reader may take to finish what it is doing (a batch
/// in ingest) before it is aborted. Readers end every wait on their stop
/// token, so only a reader that does not is ever aborted.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// The `status` frame for the tenant's current source state.
pub fn status_json(h: &Health) -> String {
    proto::encode_status(h.kind, h.state.as_str(), h.since_ms)
}

/// Sets the state; on a change, tells every session of the tenant.
pub fn set_state(
    tenant: &Tenant,
    health: &Mutex<Health>,
    state: SourceState,
    error: Option<String>,
) {
    let json = {
        let mut h = health.lock();
        if let Some(e) = error {
            h.errors += 1;
            h.last_error = Some(e);
            tenant.metrics.source_errors.increment(1);
        }
        if h.state == state {
            return;
        }
        // "starting" → "live" is not news for clients; anything else is.
        let announce = !(h.state == SourceState::Starting && state == SourceState::Live);
        h.state = state;
        h.since_ms = now_ms() as u64;
        tenant
            .metrics
            .source_up
            .set(if state == SourceState::Live { 1.0 } else { 0.0 });
        if !announce {
            return;
        }
        status_json(&h)
    };
    match state {
        SourceState::Stalled => {
            tracing::warn!(tenant = %tenant.id, "source stalled; subscribers are told")
        }
        _ => {
            tracing::info!(tenant = %tenant.id, state = state.as_str(), "source state changed; subscribers are told")
        }
    }
    tenant.sessions.broadcast("status", &json);
}

/// An HTTP source with `stall_after_ms` (on a node of its own): `stalled`
/// once nothing was published for that long, `live` again on the next
/// publish (the publish itself says so at once; this watch catches the
/// silence).
async fn watch_silence(
    tenant: Arc<Tenant>,
    health: Arc<Mutex<Health>>,
    after: Duration,
    stop: CancellationToken,
) {
    let started = now_ms() as u64;
    let tick = (after / 4).clamp(Duration::from_millis(50), Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(tick) => {}
        }
        let (last, state) = {
            let h = health.lock();
            (h.last_record_ms.unwrap_or(0).max(started), h.state)
        };
        let silent = (now_ms() as u64).saturating_sub(last) >= after.as_millis() as u64;
        match (silent, state) {
            (true, SourceState::Live) => set_state(&tenant, &health, SourceState::Stalled, None),
            (false, SourceState::Stalled) => set_state(&tenant, &health, SourceState::Live, None),
            _ => {}
        }
    }
}

/// The publish path of an HTTP source on a node of its own: records what
/// arrived, and a source stalled by silence is live again.
pub fn http_published(sources: &Sources, tenant: &Tenant, records: usize) {
    let Some(health) = sources.health(&tenant.id) else {
        return;
    };
    let stalled = {
        let mut h = health.lock();
        h.last_record_ms = Some(now_ms() as u64);
        h.records += records as u64;
        h.state == SourceState::Stalled
    };
    if stalled {
        set_state(tenant, &health, SourceState::Live, None);
    }
}

/// Runs a reader until `stop`: every failed `attempt` marks the source stalled
/// and is retried after a backoff (100 ms, doubling to 1 s). An attempt watches
/// `stop` itself (so it can store its position first) and returns `Ok` then.
pub(crate) async fn keep_reading<E, F>(
    tenant: &Tenant,
    health: &Mutex<Health>,
    stop: &CancellationToken,
    kind: &str,
    mut attempt: impl FnMut() -> F,
) where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<(), E>>,
{
    let mut backoff = std::time::Duration::from_millis(100);
    while !stop.is_cancelled() {
        match attempt().await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(tenant = %tenant.id, source = kind, error = %e, "source failed; retrying");
                set_state(tenant, health, SourceState::Stalled, Some(e.to_string()));
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(std::time::Duration::from_secs(1));
    }
}

/// Starts the tenant's source task on the node's tracker, after the one
/// before (of this tenant id, even of a tenant deleted since) has ended:
/// never two readers for one tenant id, even when changes race.
pub async fn start(
    sources: &Sources,
    tenant: &Arc<Tenant>,
    config: SourceConfig,
    created_at_ms: i64,
) {
    let ctx = &sources.ctx;
    let turn = sources.slot(&tenant.id).turn.clone();
    let _turn = turn.lock().await;
    let previous = {
        let mut slot = sources.slot(&tenant.id);
        slot.stop.cancel();
        slot.done.take()
    };
    if let Some(task) = previous {
        finish(&tenant.id, task).await;
    }
    // What the reader reads: the tenant's source, or in cluster mode with
    // `--cluster-kafka` an `http` tenant's own publish topic.
    let log_topic = match (&config, ctx.log_kafka.as_ref()) {
        (SourceConfig::Http { .. }, Some(k)) => Some(SourceConfig::Kafka {
            brokers: k.brokers.clone(),
            topics: vec![k.topic(&tenant.id)],
            // A node new to the tenant: the last seconds, as for the
            // registry's log (registry/log.rs).
            start: kafka::KafkaStart::Timestamp((now_ms() as u64).saturating_sub(10_000)),
            channel_from: None,
            options: Default::default(),
            generation: 0,
        }),
        _ => None,
    };
    let reads = log_topic.as_ref().unwrap_or(&config);
    let cluster = ctx.log.is_some() || ctx.log_kafka.is_some();
    let seed = reads.epoch_seed(&tenant.id, created_at_ms, cluster);
    if tenant.hub.seed() != seed {
        // Another position space. What the old source's window holds goes
        // out at its own positions first; then every channel starts over in
        // the new space (its subscribers are told the new epoch). An edit
        // that keeps the source's identity keeps positions, marks and
        // history: nothing already published comes again.
        crate::ingest::flush(tenant);
        tenant.hub.new_source(seed);
    }
    let mut health = Health::new(config.kind());
    health.rebased_from = tenant.rebased.load(Ordering::Relaxed);
    let health = Arc::new(Mutex::new(health));
    let stop = ctx.shutdown.child_token();
    let done = match reads {
        SourceConfig::Http { .. } => match &ctx.log {
            // Cluster mode: publishes reach every node through the log.
            Some(log) => {
                let reader = outbox::Reader::for_log(
                    ctx.clone(),
                    tenant.clone(),
                    log.clone(),
                    created_at_ms,
                    health.clone(),
                    stop.clone(),
                );
                Some(ctx.tracker.spawn(reader.run()))
            }
            None => {
                tenant.metrics.source_up.set(1.0);
                None
            }
        },
        SourceConfig::PostgresOutbox { .. } => {
            let reader = outbox::Reader::new(
                ctx.clone(),
                tenant.clone(),
                config.clone(),
                health.clone(),
                stop.clone(),
            );
            Some(ctx.tracker.spawn(reader.run()))
        }
        SourceConfig::Kafka {
            brokers, topics, ..
        } => {
            let reader = kafka::Reader::new(
                ctx.clone(),
                tenant.clone(),
                reads.clone(),
                health.clone(),
                stop.clone(),
            );
            let create = log_topic
                .is_some()
                .then(|| (brokers.clone(), topics[0].clone()));
            Some(ctx.tracker.spawn(async move {
                if let Some((brokers, topic)) = create {
                    kafka::ensure_topic(&brokers, &topic).await;
                }
                reader.run().await
            }))
        }
    };
    if let (
        SourceConfig::Http {
            stall_after_ms: Some(ms),
        },
        false,
    ) = (reads, cluster)
    {
        ctx.tracker.spawn(watch_silence(
            tenant.clone(),
            health.clone(),
            Duration::from_millis(*ms),
            stop.clone(),
        ));
    }
    let mut slot = sources.slot(&tenant.id);
    // A session connected while the old source was stalled must not keep
    // believing it: the new source starts fresh.
    let was_stalled = slot.health.lock().state == SourceState::Stalled;
    let publisher = match reads {
        SourceConfig::Kafka {
            brokers,
            topics,
            channel_from,
            options,
            ..
        } => Some(Arc::new(kafka::produce::Publisher::new(
            brokers,
            topics,
            options,
            channel_from.as_deref(),
        ))),
        _ => None,
    };
    *slot = SourceSlot {
        config,
        health,
        publisher,
        stop,
        done,
        turn: turn.clone(),
    };
    if was_stalled {
        let json = status_json(&slot.health.lock());
        drop(slot);
        tenant.sessions.broadcast("status", &json);
    }
}

/// Waits for a stopped reader to end; after [`STOP_GRACE`] it is aborted
/// (dropped at its next await). Either way it has ended when this returns;
/// only a plugin call it had already handed off the runtime may still finish
/// (within the plugin's deadline).
async fn finish(tenant: &str, mut task: tokio::task::JoinHandle<()>) {
    if tokio::time::timeout(STOP_GRACE, &mut task).await.is_err() {
        tracing::warn!(tenant = %tenant, "source reader did not stop within {STOP_GRACE:?}; aborting it");
        task.abort();
        let _ = task.await;
    }
}

/// Stops the tenant's source and waits for the reader to end (shutdown,
/// deletion): it finishes its batch and stores its positions, or is aborted
/// after [`STOP_GRACE`]. `forget` (deletion) then drops the slot, still
/// under its turn, so that no reader of the id can be starting meanwhile.
pub async fn stopped(sources: &Sources, tenant: &str, forget: bool) {
    let turn = sources.slot(tenant).turn.clone();
    let _turn = turn.lock().await;
    let task = {
        let mut slot = sources.slot(tenant);
        slot.stop.cancel();
        slot.done.take()
    };
    if let Some(task) = task {
        finish(tenant, task).await;
    }
    if forget {
        sources.slots.lock().remove(tenant);
    }
}

/// Stops every tenant's reader at once: all of them get the same
/// [`STOP_GRACE`], so a shutdown waits for the slowest one, not their sum.
pub async fn stopped_all(sources: &Sources) {
    let ids: Vec<Box<str>> = sources.slots.lock().keys().cloned().collect();
    futures_util::future::join_all(ids.iter().map(|id| stopped(sources, id, false))).await;
}

/// The `status` frame a new session gets when the source is not live.
pub fn status_for_new_session(sources: &Sources, tenant: &Tenant) -> Option<String> {
    let health = sources.health(&tenant.id)?;
    let h = health.lock();
    (h.state == SourceState::Stalled).then(|| status_json(&h))
}

#[cfg(test)]
mod tests;
