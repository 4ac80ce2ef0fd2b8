-- Receipts of keyed publishes into a Kafka tenant's topic (Idempotency-Key):
-- per item of the batch, where the brokers stored it (null: not acknowledged
-- yet), so a retry produces only what is missing and is answered as the
-- first. `claimed_until` (ms): a publish under the key is in flight until
-- then. Kept a day.
CREATE TABLE publish_receipts (
    tenant_id TEXT NOT NULL,
    key TEXT NOT NULL,
    written TEXT NOT NULL,
    claimed_until BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX publish_receipts_created_at ON publish_receipts (tenant_id, created_at);
