-- The browser origins a tenant's clients may come from (issue 11): a JSON
-- array of "scheme://host[:port]", or null for any origin.
ALTER TABLE tenants ADD COLUMN allowed_origins TEXT NOT NULL DEFAULT 'null';
