-- Jobs that one live owner at a time may run. Every transition is one statement whose
-- WHERE re-checks owner, fence, state and an unexpired lease on the database clock.
CREATE TABLE fg_jobs (
  id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant           text        NOT NULL,
  type             text        NOT NULL,
  key              text        NOT NULL,
  payload          jsonb,
  state            text        NOT NULL CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
  -- Raised by every claim: the token the gateway enforces for this job's commands.
  fence            bigint      NOT NULL DEFAULT 0,
  attempt          integer     NOT NULL DEFAULT 0,
  owner            text,
  lease_until      timestamptz,
  -- When this attempt was claimed: a lease renewed past max_runtime is refused.
  started_at       timestamptz,
  run_after        timestamptz NOT NULL DEFAULT now(),
  cancel_requested boolean     NOT NULL DEFAULT false,
  result           jsonb,
  error            jsonb,
  error_code       text,
  cursor_length    integer     NOT NULL DEFAULT 0,
  created_at       timestamptz NOT NULL DEFAULT now(),
  finished_at      timestamptz,
  UNIQUE (tenant, type, key)
);
CREATE INDEX fg_jobs_queued ON fg_jobs (tenant, run_after, id) WHERE state = 'queued';
CREATE INDEX fg_jobs_leased ON fg_jobs (tenant, lease_until, id) WHERE state = 'running';

-- Partial output, appended in sequence under a live lease.
CREATE TABLE fg_job_chunks (
  job_id bigint  NOT NULL REFERENCES fg_jobs (id) ON DELETE CASCADE,
  seq    integer NOT NULL CHECK (seq >= 0),
  chunk  jsonb   NOT NULL,
  fence  bigint  NOT NULL,
  PRIMARY KEY (job_id, seq)
);
