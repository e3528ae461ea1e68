import type { JobType } from '../config/schema.js'
import type { Schedule } from '../store/batch.js'
import type { Db } from '../store/db.js'
import { claimJobs, type Claimed, type ClaimedRow, type ClaimRequest } from './claim.js'
import { durably, localDurability, type Durability } from '../store/durability.js'
import { latestPosition, readPosition } from '../store/wal.js'
import { createJobCompleter, type CompletionAudit } from './complete.js'
import { typesJson } from './job-types.js'
import { chunksFrom, getJob, lostReason } from './read.js'
import { purgeFinishedJobs } from './retention.js'
import { startJobs, type StartItem } from './start-many.js'
import { jobsChannel } from './wake.js'

export type { JobView } from './read.js'
export type { Claimed, ClaimRequest } from './claim.js'
export { maxClaimBatch } from './claim.js'
export { maxBulkStart, type StartItem, type Started } from './start-many.js'

import type { Holder, JobState } from './types.js'

export type { Holder, JobState, LostReason } from './types.js'

// Every holder statement below reaches its row by primary key and re-checks the holder
// as one CASE. Plain ANDs with `state = 'running' AND lease_until > now()` let the planner
// take fg_jobs_expiring instead when its statistics saw few running jobs, and walk the
// dead entry every finished job leaves there (migrations/0011 says more).

/**
 * Starts a job by its natural key, or joins the one that exists. With
 * `restart`, a failed or cancelled job starts a new attempt cycle under the same id.
 * One statement, so two concurrent starts of one key always get one job id.
 */
export async function startJob(db: Db, s: { tenant: string; type: string; key: string; payload: unknown; restart: boolean }) {
  const [row] = await db.sql<{ job_id: string; state: JobState; created: boolean; result: unknown }>`
    WITH started AS (
    INSERT INTO fg_jobs AS j (tenant, type, key, payload, state)
    VALUES (${s.tenant}, ${s.type}, ${s.key}, ${JSON.stringify(s.payload ?? null)}::text::jsonb, 'queued')
    ON CONFLICT (tenant, type, key) DO UPDATE SET
      (state, attempt, owner, lease_until, started_at, run_after, cancel_requested, result, error, error_code, finished_at, payload, cursor_length) = (
        SELECT state, attempt, owner, lease_until, started_at, run_after, cancel_requested, result, error, error_code, finished_at, payload, cursor_length FROM (
          SELECT 0 AS pick, 'queued' AS state, 0 AS attempt, NULL::text AS owner, NULL::timestamptz AS lease_until, NULL::timestamptz AS started_at,
                 now() AS run_after, false AS cancel_requested, NULL::jsonb AS result, NULL::jsonb AS error, NULL::text AS error_code,
                 NULL::timestamptz AS finished_at, EXCLUDED.payload AS payload, 0 AS cursor_length
          WHERE ${s.restart}::boolean AND j.state IN ('failed', 'cancelled')
          UNION ALL
          SELECT 1, j.state, j.attempt, j.owner, j.lease_until, j.started_at, j.run_after, j.cancel_requested, j.result, j.error, j.error_code, j.finished_at, j.payload, j.cursor_length
        ) AS choice ORDER BY pick LIMIT 1)
    RETURNING id, type, state, (xmax = 0) AS created, result, attempt, cursor_length
    ), cleared AS (
      -- A restarted cycle (attempt and cursor back to 0) starts with no output; a never-run job has none to clear.
      DELETE FROM fg_job_chunks AS c USING started AS s
      WHERE c.job_id = s.id AND ${s.restart}::boolean AND s.state = 'queued' AND s.attempt = 0 AND s.cursor_length = 0
    ), woken AS (
      -- Wakes waiting claims (src/leases/wake.ts). NOTIFY is delivered at commit, so no claim wakes before it can see the row.
      SELECT pg_notify(${jobsChannel}, s.type || ':' || ${s.tenant}::text) FROM started AS s WHERE s.state = 'queued' AND (s.created OR ${s.restart}::boolean)
    )
    -- Joining the count makes the woken CTE run: an unreferenced SELECT in WITH would not.
    SELECT id::text AS job_id, state, created, result FROM started CROSS JOIN (SELECT count(*) FROM woken) AS w`
  return row!
}

/**
 * Claims the earliest claimable job of the given types (see {@link claimJobs}); a job
 * out of attempts (or cancelled) comes back finished instead, and the caller claims again.
 */
export async function claimOne(db: Db, c: Omit<ClaimRequest, 'max'>): Promise<ClaimedRow | undefined> {
  return (await claimJobs(db, { ...c, max: 1 }))[0]
}

/**
 * A claim admitted by the store's durability (src/store/durability.ts) and observed before
 * its fences are handed out: after a failover that lost claims, the same fence could go to
 * a second worker. The position columns stay here.
 */
async function durableClaim(durability: Durability, claim: () => Promise<ClaimedRow[]>): Promise<Claimed[]> {
  const rows = await durably(durability, claim, (claimed) => latestPosition(claimed.map(readPosition)))
  return rows.map(({ fg_wal: _w, fg_lsn: _l, fg_boot: _b, ...claimed }) => claimed)
}

/**
 * Renews the lease only for this owner and fence, on an unexpired lease of a
 * running job within max_runtime. GREATEST keeps a stored lease from ever
 * shrinking, whatever any clock did. `lease_remaining_ms` is the renewed lease
 * left by the database's now(), computed in the same statement.
 */
export async function heartbeat(db: Db, h: Holder, types: JobType[]) {
  // lease_left_ms is for metrics only: the RETURNING subquery reads the row as the statement began (the lease before renewal).
  const [row] = await db.sql<{ lease_until: string; cancel_requested: boolean; type: string; lease_ms: number; lease_remaining_ms: number; lease_left_ms: number }>`
    UPDATE fg_jobs AS j SET lease_until = GREATEST(j.lease_until, now() + t.lease_ms * interval '1 millisecond')
    FROM jsonb_to_recordset(${typesJson(types)}::text::jsonb) AS t(name text, lease_ms bigint, max_attempts integer, backoff_ms bigint, max_runtime_ms bigint)
    WHERE j.id = ${h.jobId}::bigint AND t.name = j.type AND CASE WHEN j.tenant = ${h.tenant} AND j.owner = ${h.workerId}
      AND j.owner_sub IS NOT DISTINCT FROM ${h.sub ?? null}::text AND j.fence = ${h.fence}::bigint AND j.state = 'running' AND j.lease_until > now()
      AND j.started_at + t.max_runtime_ms * interval '1 millisecond' > now() THEN true ELSE false END
    RETURNING to_char(j.lease_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS lease_until, j.cancel_requested, j.type,
              t.lease_ms::integer AS lease_ms,
              floor(extract(epoch FROM (j.lease_until - now())) * 1000)::integer AS lease_remaining_ms,
              floor(extract(epoch FROM ((SELECT p.lease_until FROM fg_jobs AS p WHERE p.id = j.id) - now())) * 1000)::integer AS lease_left_ms`
  return row
}

/** Fails a job whose owner kept renewing past max_runtime; true when this holder's attempt was ended. */
export async function failOverRuntime(db: Db, h: Holder, types: JobType[]): Promise<boolean> {
  const rows = await db.sql`
    UPDATE fg_jobs AS j SET state = 'failed', error_code = 'max_runtime', finished_at = now(), lease_until = NULL
    FROM jsonb_to_recordset(${typesJson(types)}::text::jsonb) AS t(name text, lease_ms bigint, max_attempts integer, backoff_ms bigint, max_runtime_ms bigint)
    WHERE j.id = ${h.jobId}::bigint AND t.name = j.type AND CASE WHEN j.tenant = ${h.tenant} AND j.owner = ${h.workerId}
      AND j.owner_sub IS NOT DISTINCT FROM ${h.sub ?? null}::text AND j.fence = ${h.fence}::bigint AND j.state = 'running'
      AND j.started_at + t.max_runtime_ms * interval '1 millisecond' <= now() THEN true ELSE false END
    RETURNING 1`
  return rows.length === 1
}

/**
 * Appends chunk `seq` under a live lease. The job row is locked first, so
 * appends to one job are serialised; the chunk's primary key backs that up.
 */
export async function append(db: Db, h: Holder, seq: number, chunk: unknown) {
  const [row] = await db.sql<{ live: boolean; inserted: boolean; same: boolean | null; cursor_length: number | null }>`
    WITH live AS (
      SELECT id, cursor_length FROM fg_jobs
      WHERE id = ${h.jobId}::bigint AND CASE WHEN tenant = ${h.tenant} AND owner = ${h.workerId} AND fence = ${h.fence}::bigint
        AND owner_sub IS NOT DISTINCT FROM ${h.sub ?? null}::text AND state = 'running' AND lease_until > now() AND NOT cancel_requested THEN true ELSE false END
      FOR UPDATE
    ), inserted AS (
      INSERT INTO fg_job_chunks (job_id, seq, chunk, fence)
      SELECT id, ${seq}, ${JSON.stringify(chunk)}::text::jsonb, ${h.fence}::bigint FROM live WHERE cursor_length = ${seq}
      RETURNING seq
    ), bumped AS (
      UPDATE fg_jobs AS j SET cursor_length = j.cursor_length + 1 FROM inserted WHERE j.id = ${h.jobId}::bigint
      RETURNING j.cursor_length
    )
    SELECT EXISTS (SELECT 1 FROM live) AS live, EXISTS (SELECT 1 FROM inserted) AS inserted,
           (SELECT c.chunk = ${JSON.stringify(chunk)}::text::jsonb FROM fg_job_chunks AS c, live
             WHERE c.job_id = live.id AND c.seq = ${seq} AND ${seq} = live.cursor_length - 1) AS same,
           coalesce((SELECT cursor_length FROM bumped), (SELECT cursor_length FROM live)) AS cursor_length`
  return row!
}

/** Ends this holder's attempt: back to queued after backoff when retryable and attempts remain, else failed. */
export async function fail(db: Db, h: Holder, types: JobType[], error: unknown, retryable: boolean) {
  const [row] = await db.sql<{ state: string }>`
    WITH failed AS (
    UPDATE fg_jobs AS j SET
      state = CASE WHEN j.cancel_requested THEN 'cancelled' WHEN ${retryable}::boolean AND j.attempt < t.max_attempts THEN 'queued' ELSE 'failed' END,
      error_code = CASE WHEN j.cancel_requested THEN NULL WHEN NOT ${retryable}::boolean THEN 'not_retryable' WHEN j.attempt >= t.max_attempts THEN 'max_attempts' ELSE NULL END,
      run_after = now() + LEAST(t.backoff_ms * power(2, j.attempt - 1)::bigint, 600000) * interval '1 millisecond',
      finished_at = CASE WHEN j.cancel_requested OR NOT ${retryable}::boolean OR j.attempt >= t.max_attempts THEN now() END,
      error = ${JSON.stringify(error ?? null)}::text::jsonb, owner = NULL, lease_until = NULL
    FROM jsonb_to_recordset(${typesJson(types)}::text::jsonb) AS t(name text, lease_ms bigint, max_attempts integer, backoff_ms bigint, max_runtime_ms bigint)
    WHERE j.id = ${h.jobId}::bigint AND t.name = j.type AND CASE WHEN j.tenant = ${h.tenant} AND j.owner = ${h.workerId}
      AND j.owner_sub IS NOT DISTINCT FROM ${h.sub ?? null}::text AND j.fence = ${h.fence}::bigint AND j.state = 'running' AND j.lease_until > now() THEN true ELSE false END
    RETURNING j.state, j.type
    ), woken AS (
      -- Back in the queue: wake waiting claims at commit (they find it once its backoff has passed).
      SELECT pg_notify(${jobsChannel}, type || ':' || ${h.tenant}::text) FROM failed WHERE state = 'queued'
    )
    SELECT state FROM failed CROSS JOIN (SELECT count(*) FROM woken) AS w`
  return row
}

/**
 * Gives the job back without ending the attempt as a failure: only this owner and
 * fence, on an unexpired lease of a running job. The job is claimable at once
 * (`run_after = now()`) and the attempt is returned (`attempt - 1`), so
 * max_attempts counts only attempts that failed or expired. The fence stays: the
 * next claim raises it, so the releaser's token is stale from then on. With a
 * cancel pending the job ends `cancelled` instead, as a fail would end it.
 *
 * @example
 * const r = await release(db, { tenant: 'default', jobId: '42', workerId: 'w1', fence: '3' }) // undefined: not this holder's
 */
export async function release(db: Db, h: Holder) {
  const [row] = await db.sql<{ state: string; type: string; attempt: number }>`
    WITH released AS (
      UPDATE fg_jobs SET
        state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END,
        finished_at = CASE WHEN cancel_requested THEN now() END,
        attempt = CASE WHEN cancel_requested THEN attempt ELSE attempt - 1 END,
        run_after = now(), owner = NULL, lease_until = NULL
      WHERE id = ${h.jobId}::bigint AND CASE WHEN tenant = ${h.tenant} AND owner = ${h.workerId} AND fence = ${h.fence}::bigint
        AND owner_sub IS NOT DISTINCT FROM ${h.sub ?? null}::text AND state = 'running' AND lease_until > now() THEN true ELSE false END
      RETURNING state, type, attempt
    ), woken AS (
      -- Claimable at once: wake waiting claims at commit, as start and a retryable fail do.
      SELECT pg_notify(${jobsChannel}, type || ':' || ${h.tenant}::text) FROM released WHERE state = 'queued'
    )
    SELECT state, type, attempt FROM released CROSS JOIN (SELECT count(*) FROM woken) AS w`
  return row
}

/** Requests cancellation: a queued job is cancelled at once, a running one learns it at its next heartbeat. */
export async function cancel(db: Db, tenant: string, jobId: string) {
  const [row] = await db.sql<{ state: string }>`
    UPDATE fg_jobs SET cancel_requested = true,
      state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
      finished_at = CASE WHEN state = 'queued' THEN now() ELSE finished_at END
    WHERE id = ${jobId}::bigint AND tenant = ${tenant} AND state IN ('queued', 'running', 'cancelled')
    RETURNING state`
  return row
}

/** The lease statements bound to one database. */
export type JobStore = ReturnType<typeof createJobStore>

/**
 * Binds the lease statements to a Db (PostgreSQL or PGlite).
 *
 * @example
 * const jobs = createJobStore(db)
 * const claimed = await jobs.claimOne({ tenant: 'default', workerId: 'w1', types: config.job_types })
 */
export function createJobStore(db: Db, options: { schedule?: Schedule; durability?: Durability } = {}) {
  const completer = createJobCompleter(db, options.schedule)
  const durability = options.durability ?? localDurability
  return {
    startJob: (s: Parameters<typeof startJob>[1]) => startJob(db, s),
    startJobs: (tenant: string, items: StartItem[]) => startJobs(db, tenant, items),
    claimOne: async (c: Parameters<typeof claimOne>[1]) => (await durableClaim(durability, () => claimJobs(db, { ...c, max: 1 })))[0],
    claimJobs: (c: ClaimRequest) => durableClaim(durability, () => claimJobs(db, c)),
    heartbeat: (h: Holder, types: JobType[]) => heartbeat(db, h, types),
    failOverRuntime: (h: Holder, types: JobType[]) => failOverRuntime(db, h, types),
    lostReason: (h: Holder) => lostReason(db, h),
    append: (h: Holder, seq: number, chunk: unknown) => append(db, h, seq, chunk),
    /** Completes under the live lease; the completions of one turn share a statement (src/leases/complete.ts). */
    complete: (h: Holder, result: unknown, audit: CompletionAudit) => completer.complete(h, result, audit),
    fail: (h: Holder, types: JobType[], error: unknown, retryable: boolean) => fail(db, h, types, error, retryable),
    release: (h: Holder) => release(db, h),
    cancel: (tenant: string, jobId: string) => cancel(db, tenant, jobId),
    /** Deletes up to `limit` jobs finished more than `retentionMs` ago, with their chunks (job_retention). */
    purgeFinished: (retentionMs: number, limit?: number) => purgeFinishedJobs(db, retentionMs, limit),
    getJob: (tenant: string, jobId: string) => getJob(db, tenant, jobId),
    chunksFrom: (jobId: string, from: number) => chunksFrom(db, jobId, from),
    /** LISTENs for jobs becoming claimable; undefined where the Db cannot listen (claims then poll). */
    listenForWork: db.listen ? (onType: (type: string) => void, onReconnect: () => void) => db.listen!(jobsChannel, onType, onReconnect) : undefined,
  }
}
