-- Migration 0004 (PostgreSQL dialect): leases, for workers on other hosts. A running job is held by one
-- runner (lease_owner: the server or a worker agent, "kind/host/data-dir") until
-- lease_expires_at (Unix s), which the runner renews while the job's worker lives; a lease
-- that runs out puts the job back in the queue (or fails it when its starts are spent).
-- engine is the target's serving engine: a runner claims only jobs whose engine it has.
ALTER TABLE jobs ADD COLUMN lease_owner TEXT NOT NULL DEFAULT '';
ALTER TABLE jobs ADD COLUMN lease_expires_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN engine TEXT NOT NULL DEFAULT 'autocompress';
UPDATE jobs SET engine='llama.cpp' WHERE spec LIKE '%"engine":"llama.cpp"%';
CREATE INDEX jobs_lease ON jobs(status, lease_expires_at);
