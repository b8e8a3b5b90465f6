-- Migration 0002 (PostgreSQL dialect): the webhook outbox. A row is written in the same transaction that
-- moves a job with a callback_url to a terminal state, so a notification is never lost
-- (at-least-once delivery); the server's sender retries it with backoff.
CREATE TABLE webhooks (
  id TEXT NOT NULL PRIMARY KEY,
  job_id TEXT NOT NULL,
  url TEXT NOT NULL,
  type TEXT NOT NULL,
  payload TEXT NOT NULL,
  state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending','delivered','failed')),
  attempts BIGINT NOT NULL DEFAULT 0,
  next_at BIGINT NOT NULL,
  last_error TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  delivered_at BIGINT NOT NULL DEFAULT 0);
CREATE INDEX webhooks_due ON webhooks(state, next_at);
CREATE INDEX webhooks_job ON webhooks(job_id);
