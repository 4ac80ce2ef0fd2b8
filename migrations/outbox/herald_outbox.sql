-- The outbox table a tenant's application writes to, in the same transaction
-- as its business data. Herald tails it by increasing id (woken by the
-- trigger's NOTIFY, with polling as the safety net) and keeps its cursor per
-- node in Herald's registry; it never writes to this table.
--
--   channel        the Herald channel (1-128 chars of [A-Za-z0-9_.:@-])
--   key            optional conflation key
--   payload        JSON payload (delivered as-is) ...
--   payload_bytes  ... or arbitrary bytes (delivered base64); one of the two
--   headers        optional JSON object of string values, passed to the plugin
--
-- Retention: Herald only reads rows above its cursor, so delete old rows on a
-- schedule, e.g. keep one day: DELETE FROM herald_outbox WHERE created_at <
-- now() - interval '1 day'. Keep at least as long as a node may be down (a
-- node resumes from its cursor; rows deleted before it resumed are lost to it).
CREATE TABLE herald_outbox (
    id bigserial PRIMARY KEY,
    channel text NOT NULL,
    key text,
    payload jsonb,
    payload_bytes bytea,
    headers jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((payload IS NULL) <> (payload_bytes IS NULL))
);

CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('herald_outbox', TG_TABLE_NAME);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER herald_outbox_notify AFTER INSERT ON herald_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_notify();
