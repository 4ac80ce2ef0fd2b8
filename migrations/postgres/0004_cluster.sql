-- Cluster mode (README, "Cluster mode"): every change to a tenant or its
-- plugins is announced to every node (NOTIFY herald_registry, delivered at
-- commit: the tenant id, or "tenant:version" for an uploaded plugin, which
-- every node then compiles ahead of its activation), the nodes seen, and the log HTTP publishes go through
-- so that every node delivers them at the same positions.
CREATE FUNCTION herald_registry_notify() RETURNS trigger AS $$
BEGIN
    IF TG_TABLE_NAME = 'plugins' THEN
        IF TG_OP = 'INSERT' THEN
            PERFORM pg_notify('herald_registry', NEW.tenant_id || ':' || NEW.version);
        ELSIF TG_OP = 'DELETE' THEN
            PERFORM pg_notify('herald_registry', OLD.tenant_id);
        ELSE
            PERFORM pg_notify('herald_registry', NEW.tenant_id);
        END IF;
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('herald_registry', OLD.id);
    ELSE
        PERFORM pg_notify('herald_registry', NEW.id);
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER herald_tenants_notify AFTER INSERT OR UPDATE OR DELETE ON tenants
    FOR EACH ROW EXECUTE FUNCTION herald_registry_notify();
CREATE TRIGGER herald_plugins_notify AFTER INSERT OR UPDATE OR DELETE ON plugins
    FOR EACH ROW EXECUTE FUNCTION herald_registry_notify();

CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    address TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    heartbeat_at BIGINT NOT NULL,
    connections BIGINT NOT NULL,
    -- {"tenant": active plugin version} as this node runs them
    plugins TEXT NOT NULL DEFAULT '{}'
);

-- The shared log of HTTP publishes: the outbox shape (migrations/outbox)
-- with the tenant, read by every node in (xid, id) order per tenant.
CREATE TABLE herald_publish_log (
    id bigserial PRIMARY KEY,
    tenant_id text NOT NULL,
    channel text NOT NULL,
    key text,
    payload jsonb,
    payload_bytes bytea,
    headers jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    CHECK ((payload IS NULL) <> (payload_bytes IS NULL))
);
CREATE INDEX herald_publish_log_tenant_xid_id ON herald_publish_log (tenant_id, xid, id);
CREATE INDEX herald_publish_log_created_at ON herald_publish_log (created_at);
