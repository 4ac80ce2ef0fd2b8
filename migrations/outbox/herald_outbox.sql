-- The outbox table a tenant's application writes to, in the same transaction
-- as its business data. Herald tails it in commit-safe order (woken by the
-- trigger's NOTIFY, with polling as the safety net) and keeps its cursor per
-- node in Herald's registry; it never writes to this table.
--
--   channel        the Herald channel (1-128 chars of [A-Za-z0-9_.:@-])
--   key            optional conflation key
--   payload        JSON payload (delivered as-is) ...
--   payload_bytes  ... or arbitrary bytes (delivered base64); one of the two
--   headers        optional JSON object of string values, passed to the plugin
--   xid            the inserting transaction (filled in by the default; the
--                  application never sets it)
--
-- Why xid: ids are taken before commit, so a lower id can become visible after
-- a higher one. Herald reads only rows whose transaction is older than every
-- transaction still open (pg_snapshot_xmin(pg_current_snapshot())), in
-- (xid, id) order: that set never changes once read, so nothing is skipped
-- however long a transaction stays open. An open transaction holds back the
-- rows committed after it (lag in the source health), never loses them. Any
-- transaction of the server that has written something counts, in any
-- database: keep transactions short, as for vacuum.
--
-- Upgrading a table made by an older Herald (rows already there get the xid
-- of the ALTER; Herald resumes after the id it had reached):
--   ALTER TABLE herald_outbox ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
--   CREATE INDEX CONCURRENTLY herald_outbox_xid_id ON herald_outbox (xid, id);
--
-- Retention: Herald only reads rows past its cursor, so delete old rows on a
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
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    CHECK ((payload IS NULL) <> (payload_bytes IS NULL))
);

-- The reader's order and its range scans.
CREATE INDEX herald_outbox_xid_id ON herald_outbox (xid, id);

CREATE OR REPLACE FUNCTION herald_outbox_notify() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('herald_outbox', TG_TABLE_NAME);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER herald_outbox_notify AFTER INSERT ON herald_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION herald_outbox_notify();
