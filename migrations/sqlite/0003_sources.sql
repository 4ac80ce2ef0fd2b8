-- Each tenant's ingest source, and every node's position in it.
ALTER TABLE tenants ADD COLUMN source TEXT NOT NULL DEFAULT '{"kind":"http"}';

CREATE TABLE ingest_cursors (
    tenant_id TEXT NOT NULL,
    node_id TEXT NOT NULL,
    source_key TEXT NOT NULL,
    position TEXT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, node_id, source_key)
);
