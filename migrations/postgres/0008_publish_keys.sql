-- Idempotency keys of publishes through the shared log (cluster mode): a
-- batch published again under the same key (a retry after a lost answer) is
-- answered with the ids of the first, and nothing is logged twice. Kept as
-- long as the log keeps rows.
CREATE TABLE herald_publish_keys (
    tenant_id text NOT NULL,
    key text NOT NULL,
    ids bigint[],
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX herald_publish_keys_created_at ON herald_publish_keys (created_at);
