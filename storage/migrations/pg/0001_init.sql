-- Migration 0001 (PostgreSQL dialect of storage/migrations/0001_init.sql): jobs (and
-- calibrations, kind = 'calibration'), events, artifact metadata, idempotency keys,
-- registered models, and the change counter behind long-polls. Append-only, like the
-- SQLite files: a new migration is a new file in both dialects.
CREATE TABLE jobs (
  seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('queued','running','succeeded','failed','cancelled')),
  device TEXT NOT NULL,
  name TEXT NOT NULL DEFAULT '',
  spec TEXT NOT NULL,
  stages TEXT NOT NULL,
  stage_index INTEGER NOT NULL DEFAULT 0,
  stage TEXT NOT NULL DEFAULT '',
  step BIGINT NOT NULL DEFAULT 0,
  total_steps BIGINT NOT NULL DEFAULT 0,
  error_code TEXT NOT NULL DEFAULT '',
  error_message TEXT NOT NULL DEFAULT '',
  report TEXT NOT NULL DEFAULT '{}',
  cancel_requested INTEGER NOT NULL DEFAULT 0,
  worker_pid INTEGER NOT NULL DEFAULT 0,
  attempts INTEGER NOT NULL DEFAULT 0,
  version BIGINT NOT NULL DEFAULT 1,
  created_at BIGINT NOT NULL,
  started_at BIGINT NOT NULL DEFAULT 0,
  finished_at BIGINT NOT NULL DEFAULT 0,
  updated_at BIGINT NOT NULL);
CREATE INDEX jobs_queue ON jobs(status, device, seq);
CREATE INDEX jobs_kind ON jobs(kind, seq);
CREATE TABLE events (
  seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  job_id TEXT NOT NULL,
  type TEXT NOT NULL,
  message TEXT NOT NULL,
  data TEXT,
  created_at BIGINT NOT NULL);
CREATE INDEX events_job ON events(job_id, seq);
CREATE TABLE artifacts (
  id TEXT NOT NULL UNIQUE,
  job_id TEXT NOT NULL,
  name TEXT NOT NULL,
  stage TEXT NOT NULL,
  sha256 TEXT NOT NULL,
  size_bytes BIGINT NOT NULL,
  content_type TEXT NOT NULL,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (job_id, name));
CREATE INDEX artifacts_sha ON artifacts(sha256);
CREATE TABLE idempotency (
  scope TEXT NOT NULL,
  key TEXT NOT NULL,
  body_sha256 TEXT NOT NULL,
  job_id TEXT NOT NULL,
  status INTEGER NOT NULL,
  response TEXT NOT NULL,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (scope, key));
CREATE TABLE models (
  seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  path TEXT NOT NULL,
  tokenizer TEXT NOT NULL DEFAULT '',
  name TEXT NOT NULL DEFAULT '',
  format TEXT NOT NULL,
  created_at BIGINT NOT NULL);
CREATE SEQUENCE ac_data_version;
SELECT nextval('ac_data_version');
