-- A claim reads the head of the queue, not the queue: one index per candidate kind,
-- each ordered the way the claim takes jobs, so an index scan stops at the first
-- unlocked row whatever the depth (src/leases/store.ts, claimJobs). Type is in both
-- keys because a claim names its types; one type's backlog never slows another's claim.
CREATE INDEX fg_jobs_due ON fg_jobs (tenant, type, run_after, id) WHERE state = 'queued';
CREATE INDEX fg_jobs_expiring ON fg_jobs (tenant, type, lease_until, id) WHERE state = 'running';
-- The old heads (tenant, due time) are prefixes of nothing the claim asks now.
DROP INDEX fg_jobs_queued;
DROP INDEX fg_jobs_leased;
-- Retention (job_retention) deletes finished jobs oldest first, in bounded batches.
CREATE INDEX fg_jobs_finished ON fg_jobs (finished_at, id) WHERE state IN ('succeeded', 'failed', 'cancelled');
