import type { JobType } from '../config/schema.js'
import { inlined, retryRolledBack, withInlined, type Db } from '../store/db.js'
import { typesJson } from './job-types.js'
import type { PositionRow } from '../store/wal.js'

// The claim: the only statement that reads the queue. Its cost must not grow with the
// queue's depth, so each candidate kind is one index scan in claim order that stops at
// the first unlocked rows (fg_jobs_due, fg_jobs_expiring: migrations/0008), and the
// earlier of the candidates is taken. test/leases-claim-plan.test.ts holds the plan.
//
// The UPDATE re-checks tenant, type and claimability as one CASE on purpose: a CASE is a
// filter on the row found, never an access path, so the row is reached by its primary
// key whatever the statistics say. Written as plain ANDs, the same conditions let the
// planner reach it by a bitmap over the queue's indexes or by (tenant, type, key), and
// it does so on a table it has not analyzed yet (PGlite never analyzes on its own).

export interface Claimed {
  job_id: string
  type: string
  payload: unknown
  fence: string
  lease_until: string
  /** The job type's lease length. */
  lease_ms: number
  /** `lease_until - now()` by the database, in the claim statement itself: a duration a worker can hold against its own clock. */
  lease_remaining_ms: number
  attempt: number
  /** Output chunks the job already has: where this attempt's appends continue. */
  cursor_length: number
  state: string
  /** The job was running on a lease that had expired (a reclaim), as the claim's locked row showed. */
  reclaimed: boolean
  /**
   * The owner the claim recorded (null for a job it finished instead): a worker that claimed
   * without naming itself learns here what to send with its heartbeats.
   */
  worker_id: string | null
}

/** A claimed row with where the claim left the WAL (src/store/wal.ts): a claim issues fences, which a lossy failover could issue again. */
export type ClaimedRow = Claimed & PositionRow

/** The most jobs one claim statement takes. */
export const maxClaimBatch = 100

export interface ClaimRequest {
  tenant: string
  workerId: string
  /**
   * One owner per job of a batch (the slots of one worker process): the claim's n-th job is
   * recorded under the n-th, and `workerId` is used past their end. At most `max` are used.
   */
  workerIds?: string[]
  types: JobType[]
  /**
   * The claiming token's `sub`, recorded as the lease's holder (owner_sub, migrations/0019):
   * every holder statement and every `fence: lease` command compares it exactly. Absent or
   * null without auth.
   */
  sub?: string | null
  /** Jobs to take in this one statement, 1 to {@link maxClaimBatch}; default 1. */
  max?: number
}

/**
 * Claims up to `max` claimable jobs of the given types, earliest due first: queued
 * and due (by `run_after`), or running on an expired lease (by `lease_until`). Each
 * claimed job gets its own raised fence and its own lease. One statement with
 * `FOR UPDATE SKIP LOCKED`, on the database clock; the UPDATE re-checks tenant, type
 * and claimability. A job out of attempts (or with a cancel pending) is finished
 * instead of claimed and comes back with that state, so the caller can claim again.
 *
 * @example
 * const jobs = await claimJobs(db, { tenant: 'default', workerId: 'w1', types: config.job_types, max: 10 })
 * for (const job of jobs.filter((j) => j.state === 'running')) console.log(job.job_id, job.fence)
 */
export async function claimJobs(db: Db, c: ClaimRequest): Promise<ClaimedRow[]> {
  const max = c.max ?? 1
  if (!Number.isInteger(max) || max < 1 || max > maxClaimBatch) throw new RangeError(`max must be an integer from 1 to ${maxClaimBatch}`)
  if (c.types.length === 0) return []
  // SKIP LOCKED skips a locked candidate, but locking the newer version of a row updated
  // meanwhile still waits, so a claim can deadlock with a batch of completions (seen once
  // at 100,000 queued). PostgreSQL then rolls the claim back whole: it is claimed again.
  return retryRolledBack(async () => {
    if (max === 1 && c.types.length === 1) {
      const row = await claimOneOfType(db, c.tenant, c.workerIds?.[0] ?? c.workerId, c.sub ?? null, c.types[0]!)
      return row ? [row] : []
    }
    return claimBatch(db, c, max)
  })
}

/**
 * The common case, one job of one type, with every limit a constant: its generic plan
 * is as good as a custom one, so PostgreSQL plans it once per connection, not per claim.
 */
async function claimOneOfType(db: Db, tenant: string, workerId: string, sub: string | null, t: JobType): Promise<ClaimedRow | undefined> {
  const [row] = await db.sql<ClaimedRow>`
    WITH due AS (
      SELECT id, run_after AS at, false AS reclaimed FROM fg_jobs
      WHERE tenant = ${tenant} AND type = ${t.name} AND state = 'queued' AND run_after <= now()
      ORDER BY run_after, id LIMIT 1 FOR UPDATE SKIP LOCKED
    ), expired AS (
      SELECT id, lease_until AS at, true AS reclaimed FROM fg_jobs
      WHERE tenant = ${tenant} AND type = ${t.name} AND state = 'running' AND lease_until <= now()
      ORDER BY lease_until, id LIMIT 1 FOR UPDATE SKIP LOCKED
    ), candidate AS (
      SELECT id, reclaimed FROM (SELECT * FROM due UNION ALL SELECT * FROM expired) AS c ORDER BY at, id LIMIT 1
    )
    UPDATE fg_jobs AS j SET
      state = CASE WHEN j.cancel_requested THEN 'cancelled' WHEN j.attempt >= ${t.max_attempts}::integer THEN 'failed' ELSE 'running' END,
      error_code = CASE WHEN j.cancel_requested THEN j.error_code WHEN j.attempt >= ${t.max_attempts}::integer THEN 'max_attempts' ELSE j.error_code END,
      finished_at = CASE WHEN j.cancel_requested OR j.attempt >= ${t.max_attempts}::integer THEN now() END,
      owner = CASE WHEN j.cancel_requested OR j.attempt >= ${t.max_attempts}::integer THEN NULL ELSE ${workerId} END,
      owner_sub = CASE WHEN j.cancel_requested OR j.attempt >= ${t.max_attempts}::integer THEN NULL ELSE ${sub}::text END,
      fence = CASE WHEN j.cancel_requested OR j.attempt >= ${t.max_attempts}::integer THEN j.fence ELSE j.fence + 1 END,
      attempt = CASE WHEN j.cancel_requested OR j.attempt >= ${t.max_attempts}::integer THEN j.attempt ELSE j.attempt + 1 END,
      lease_until = CASE WHEN j.cancel_requested OR j.attempt >= ${t.max_attempts}::integer THEN NULL ELSE now() + ${t.lease}::bigint * interval '1 millisecond' END,
      started_at = now()
    FROM candidate AS c
    WHERE j.id = c.id AND CASE WHEN j.tenant <> ${tenant} OR j.type <> ${t.name} THEN false
      WHEN j.state = 'queued' THEN j.run_after <= now() WHEN j.state = 'running' THEN j.lease_until <= now() ELSE false END
    RETURNING j.id::text AS job_id, j.type, j.payload, j.fence::text AS fence, j.attempt, j.state, c.reclaimed, j.cursor_length, j.owner AS worker_id,
              to_char(j.lease_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS lease_until,
              ${t.lease}::integer AS lease_ms,
              floor(extract(epoch FROM (j.lease_until - now())) * 1000)::integer AS lease_remaining_ms,
              pg_walfile_name(pg_current_wal_insert_lsn()) AS fg_wal, pg_current_wal_insert_lsn()::text AS fg_lsn,
              extract(epoch FROM pg_postmaster_start_time())::text AS fg_boot`
  return row
}

/**
 * Several jobs, or several types: per type, the first `max` due and the first `max`
 * expired rows (each an index scan that stops there), then the earliest `max` of
 * those. Rows locked but not taken are free again when the statement commits. The
 * constant `LIMIT 100` tells the planner how few rows reach the update, so even a
 * generic plan finds them by primary key rather than hashing the table.
 */
async function claimBatch(db: Db, { tenant, workerId, workerIds, types, sub }: ClaimRequest, max: number): Promise<ClaimedRow[]> {
  // `max` is written into the text: bound, it kept PostgreSQL planning this statement on
  // every call (362 µs of planning to 401 µs of execution at 20,000 queued).
  const limit = inlined(max)
  // Which job gets which owner does not matter, only that each gets its own: so the candidates
  // are numbered in the order they come (row_number() OVER ()), which needs no sort.
  const owners = workerIds ? JSON.stringify(workerIds) : null
  return withInlined<ClaimedRow>(db)`
    WITH types AS (
      SELECT * FROM jsonb_to_recordset(${typesJson(types)}::text::jsonb) AS t(name text, lease_ms bigint, max_attempts integer)
    ), candidate AS (
      SELECT c.id, c.at, c.reclaimed, t.name AS type, t.lease_ms, t.max_attempts FROM types AS t CROSS JOIN LATERAL (
        SELECT q.id, q.run_after AS at, false AS reclaimed FROM fg_jobs AS q
        WHERE q.tenant = ${tenant} AND q.type = t.name AND q.state = 'queued' AND q.run_after <= now()
        ORDER BY q.run_after, q.id LIMIT ${limit} FOR UPDATE SKIP LOCKED) AS c
      UNION ALL
      SELECT c.id, c.at, c.reclaimed, t.name, t.lease_ms, t.max_attempts FROM types AS t CROSS JOIN LATERAL (
        SELECT r.id, r.lease_until AS at, true AS reclaimed FROM fg_jobs AS r
        WHERE r.tenant = ${tenant} AND r.type = t.name AND r.state = 'running' AND r.lease_until <= now()
        ORDER BY r.lease_until, r.id LIMIT ${limit} FOR UPDATE SKIP LOCKED) AS c
      ORDER BY at, id LIMIT ${limit}
    ), claimed AS (
      UPDATE fg_jobs AS j SET
        state = CASE WHEN j.cancel_requested THEN 'cancelled' WHEN j.attempt >= c.max_attempts THEN 'failed' ELSE 'running' END,
        error_code = CASE WHEN j.cancel_requested THEN j.error_code WHEN j.attempt >= c.max_attempts THEN 'max_attempts' ELSE j.error_code END,
        finished_at = CASE WHEN j.cancel_requested OR j.attempt >= c.max_attempts THEN now() END,
        owner = CASE WHEN j.cancel_requested OR j.attempt >= c.max_attempts THEN NULL
          ELSE coalesce(${owners}::text::jsonb ->> (c.n - 1)::integer, ${workerId}) END,
        owner_sub = CASE WHEN j.cancel_requested OR j.attempt >= c.max_attempts THEN NULL ELSE ${sub ?? null}::text END,
        fence = CASE WHEN j.cancel_requested OR j.attempt >= c.max_attempts THEN j.fence ELSE j.fence + 1 END,
        attempt = CASE WHEN j.cancel_requested OR j.attempt >= c.max_attempts THEN j.attempt ELSE j.attempt + 1 END,
        lease_until = CASE WHEN j.cancel_requested OR j.attempt >= c.max_attempts THEN NULL ELSE now() + c.lease_ms * interval '1 millisecond' END,
        started_at = now()
      FROM (SELECT *, row_number() OVER () AS n FROM candidate LIMIT 100) AS c
      WHERE j.id = c.id AND CASE WHEN j.tenant <> ${tenant} OR j.type <> c.type THEN false
        WHEN j.state = 'queued' THEN j.run_after <= now() WHEN j.state = 'running' THEN j.lease_until <= now() ELSE false END
      RETURNING j.id, c.at, j.type, j.payload, j.fence, j.attempt, j.state, c.reclaimed, j.cursor_length, j.lease_until, c.lease_ms, j.owner
    )
    SELECT id::text AS job_id, type, payload, fence::text AS fence, attempt, state, reclaimed, cursor_length, owner AS worker_id,
           to_char(lease_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS lease_until,
           lease_ms::integer AS lease_ms,
           floor(extract(epoch FROM (lease_until - now())) * 1000)::integer AS lease_remaining_ms,
           -- Read once the update has run: the row is pulled from it after its write.
           pg_walfile_name(pg_current_wal_insert_lsn()) AS fg_wal, pg_current_wal_insert_lsn()::text AS fg_lsn,
           extract(epoch FROM pg_postmaster_start_time())::text AS fg_boot
    FROM claimed ORDER BY at, id`
}
