-- What retention deleted of each tenant's publish log (cluster mode): a log
-- reader whose cursor is below it may have missed rows, and reports them to
-- its subscribers as a gap instead of reading on past the hole.
CREATE TABLE herald_publish_log_pruned (
    tenant_id text PRIMARY KEY,
    -- The last row deleted in (xid, id) order.
    xid xid8 NOT NULL,
    id bigint NOT NULL,
    -- The highest id deleted.
    max_id bigint NOT NULL
);
