-- Migration 0005 (PostgreSQL dialect): the runners (the servers that run jobs and the worker agents) and what
-- they offer, so that an API on one host accepts jobs for devices and engines that only
-- other hosts have. info is JSON: {"devices": [device objects as /v1/devices renders them],
-- "engines": [...], "workers_per_device": N}. A runner writes its row when it starts and
-- with every lease renewal (seen_at, Unix s), and removes it when it stops.
CREATE TABLE runners (
  name TEXT NOT NULL PRIMARY KEY,
  info TEXT NOT NULL,
  started_at BIGINT NOT NULL,
  seen_at BIGINT NOT NULL);
