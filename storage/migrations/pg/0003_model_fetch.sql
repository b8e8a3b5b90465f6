-- Migration 0003 (PostgreSQL dialect): models registered by URL (storage/fetch.h). A path-registered model is
-- 'ready' with no url; a URL model is 'fetching' until its download is verified, then
-- 'ready' (path = its cache file) or 'failed' (error says why). One model per sha256.
ALTER TABLE models ADD COLUMN status TEXT NOT NULL DEFAULT 'ready'
  CHECK (status IN ('fetching','ready','failed'));
ALTER TABLE models ADD COLUMN url TEXT NOT NULL DEFAULT '';
ALTER TABLE models ADD COLUMN sha256 TEXT NOT NULL DEFAULT '';
ALTER TABLE models ADD COLUMN size_bytes BIGINT NOT NULL DEFAULT -1;
ALTER TABLE models ADD COLUMN bytes_done BIGINT NOT NULL DEFAULT 0;
ALTER TABLE models ADD COLUMN bytes_total BIGINT NOT NULL DEFAULT -1;
ALTER TABLE models ADD COLUMN error TEXT NOT NULL DEFAULT '';
ALTER TABLE models ADD COLUMN updated_at BIGINT NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX models_sha256 ON models(sha256) WHERE sha256 <> '';
CREATE INDEX models_status ON models(status, seq);
