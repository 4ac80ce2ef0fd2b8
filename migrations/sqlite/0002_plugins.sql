-- Plugin versions per tenant (component bytes kept so every node can load
-- them), the active version, and the tenant's conflation window.
CREATE TABLE plugins (
    tenant_id TEXT NOT NULL,
    version BIGINT NOT NULL,
    sha256 TEXT NOT NULL,
    size_bytes BIGINT NOT NULL,
    component BLOB NOT NULL,
    name TEXT NOT NULL,
    plugin_version TEXT NOT NULL,
    hooks TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, version)
);

ALTER TABLE tenants ADD COLUMN active_plugin BIGINT;
ALTER TABLE tenants ADD COLUMN conflation TEXT NOT NULL DEFAULT '{}';
