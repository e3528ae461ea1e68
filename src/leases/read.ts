import type { Db } from '../store/db.js'
import type { Holder, JobState, LostReason } from './types.js'

// The lease service's reads: they decide nothing, so they may read after the fact.

/** A job as its owner and readers see it; the lease is reported as remaining milliseconds computed by the database. */
export interface JobView {
  job_id: string
  type: string
  key: string
  state: JobState
  attempt: number
  fence: string
  owner: string | null
  remaining_lease_ms: number | null
  cancel_requested: boolean
  cursor_length: number
  result: unknown
  error: unknown
  error_code: string | null
}

/**
 * Explains why a holder's statement matched nothing (read after the fact, for the error only).
 * `foreign`: the job is held as this worker id, but under another token's `sub` (a token whose
 * sub is `svc` naming `svc/payments`, the worker of the token whose sub is `svc/payments`).
 */
export async function lostReason(db: Db, h: Holder): Promise<LostReason | 'foreign'> {
  const [row] = await db.sql<{ state: string; owner: string | null; owner_sub: string | null; fence: string; live: boolean; cancel_requested: boolean }>`
    SELECT state, owner, owner_sub, fence::text, coalesce(lease_until > now(), false) AS live, cancel_requested
    FROM fg_jobs WHERE id = ${h.jobId}::bigint AND tenant = ${h.tenant}`
  if (!row) return 'not_found'
  if (row.state === 'cancelled' || (row.cancel_requested && row.state === 'running')) return 'cancelled'
  if (row.state === 'succeeded' || row.state === 'failed') return 'finished'
  if (row.state === 'queued' && row.owner === null && row.fence === h.fence) return 'released'
  if (row.state === 'running' && row.owner === h.workerId && row.owner_sub !== (h.sub ?? null)) return 'foreign'
  if (row.fence !== h.fence || row.owner !== h.workerId) return 'superseded'
  return 'expired'
}

/**
 * Reads one job of a tenant, with its remaining lease computed by the database.
 *
 * @example
 * const job = await getJob(db, 'default', '42')
 */
export async function getJob(db: Db, tenant: string, jobId: string): Promise<JobView | undefined> {
  const [row] = await db.sql<JobView>`
    SELECT id::text AS job_id, type, key, state, attempt, fence::text AS fence, owner,
           CASE WHEN state = 'running' THEN GREATEST(0, floor(extract(epoch FROM (lease_until - now())) * 1000))::bigint::integer END AS remaining_lease_ms,
           cancel_requested, cursor_length, result, error, error_code
    FROM fg_jobs WHERE id = ${jobId}::bigint AND tenant = ${tenant}`
  return row
}

/** Up to 1000 output chunks of a job, from sequence number `from` on. */
export async function chunksFrom(db: Db, jobId: string, from: number): Promise<unknown[]> {
  const rows = await db.sql<{ chunk: unknown }>`
    SELECT chunk FROM fg_job_chunks WHERE job_id = ${jobId}::bigint AND seq >= ${from} ORDER BY seq LIMIT 1000`
  return rows.map((r) => r.chunk)
}
