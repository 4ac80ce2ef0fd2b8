-- The nodes seen (one, on the embedded registry); see the Postgres migration.
CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    address TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL,
    connections BIGINT NOT NULL,
    plugins TEXT NOT NULL DEFAULT '{}'
);
