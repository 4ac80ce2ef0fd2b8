-- Herald registry: tenants and process-wide settings.
CREATE TABLE tenants (
    id TEXT PRIMARY KEY,
    access TEXT NOT NULL CHECK (access IN ('public', 'plugin')),
    config TEXT NOT NULL DEFAULT '{}',
    limits TEXT NOT NULL DEFAULT '{}',
    publish_key_sha256 TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE settings (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
