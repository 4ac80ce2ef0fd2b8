//! A Kafka source's topics before it reads them: the check an admin change
//! runs (options, brokers, every topic there) and the topic cluster mode's
//! `--cluster-kafka` log creates. Never: reads or produces records.

use super::{brokers, client_config, client_error, KafkaOptions, CONNECT_TIMEOUT};
use rdkafka::consumer::{BaseConsumer, Consumer as _};

/// Creates `topic` with one partition (one partition: a tenant's publishes
/// keep one order) when it does not exist. Brokers that refuse (no rights,
/// no CreateTopics) leave it to them or the operator: the reader stays
/// stalled, saying why, until the topic exists.
pub async fn ensure_topic(brokers: &str, topic: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> =
        match client_config(brokers, &KafkaOptions::default()).create() {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(%topic, error = %client_error(e), "cannot create the publish topic");
                return;
            }
        };
    // Most starts find it: ask first (creating is refused by brokers that
    // do not allow it, and not even answered by some).
    let exists = {
        let mut config = client_config(brokers, &KafkaOptions::default());
        config.set("group.id", "herald-check");
        let name = topic.to_string();
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = config.create().ok()?;
            consumer
                .fetch_metadata(Some(&name), CONNECT_TIMEOUT)
                .ok()
                .is_some_and(|m| {
                    m.topics().iter().any(|t| {
                        t.name() == name && t.error().is_none() && !t.partitions().is_empty()
                    })
                })
                .then_some(())
        })
        .await
        .ok()
        .flatten()
        .is_some()
    };
    if exists {
        return;
    }
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(-1));
    let options = AdminOptions::new().operation_timeout(Some(CONNECT_TIMEOUT));
    let created =
        tokio::time::timeout(CONNECT_TIMEOUT * 2, admin.create_topics([&new], &options)).await;
    match created {
        Ok(Ok(results)) => {
            for r in results {
                match r {
                    Ok(_) => tracing::info!(%topic, "publish topic created"),
                    Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((_, code)) => {
                        tracing::warn!(%topic, error = %code, "the publish topic was not created; create it with one partition")
                    }
                }
            }
        }
        Ok(Err(e)) => {
            tracing::warn!(%topic, error = %e, "the publish topic was not created; create it with one partition")
        }
        Err(_) => tracing::warn!(%topic, "the brokers did not answer the topic creation"),
    }
}

/// Checks the options, that the brokers answer and that every topic exists.
pub async fn check(brokers: &str, topics: &[String], options: &KafkaOptions) -> Result<(), String> {
    if topics.is_empty() {
        return Err("topics: at least one topic is required".into());
    }
    options.check()?;
    let mut config = client_config(brokers, options);
    config.set("group.id", "herald-check");
    let topics = topics.to_vec();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = config.create().map_err(client_error)?;
        brokers::find(&consumer, &topics, CONNECT_TIMEOUT).map(drop)
    })
    .await
    .map_err(|e| format!("kafka check failed: {e}"))?
}
