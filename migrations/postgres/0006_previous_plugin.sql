-- The version active before the current one (issue 13): `POST …/plugins/rollback`
-- activates it, on any node.
ALTER TABLE tenants ADD COLUMN previous_plugin BIGINT;
