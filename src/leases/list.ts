import type { Db } from '../store/db.js'
import type { JobState } from './types.js'

// The admin plane's read-only views of fg_jobs (the lease decisions live in store.ts).

/** A job as the console lists it: its holder and lease, never its payload, result or error body. */
export interface JobSummary {
  job_id: string
  type: string
  key: string
  state: JobState
  attempt: number
  fence: string
  owner: string | null
  /** Milliseconds left on a running job's lease, computed by the database; null unless running. */
  remaining_lease_ms: number | null
  cancel_requested: boolean
  error_code: string | null
  cursor_length: number
  created_at: string
  started_at: string | null
  finished_at: string | null
  run_after: string
}

/** A job with its result and error, for `GET /jobs/{id}` (the payload stays out: it may carry data). */
export interface JobDetail extends JobSummary {
  result: unknown
  error: unknown
}

export interface JobListQuery {
  tenant: string
  state?: JobState | undefined
  type?: string | undefined
  limit: number
  /** Jobs with an id below this one (keyset pagination, newest first). */
  before?: string | undefined
}

/**
 * Lists a tenant's jobs newest first, by numeric id.
 *
 * @example
 * const running = await listJobs(db, { tenant: 'default', state: 'running', limit: 50 })
 */
export async function listJobs(db: Db, q: JobListQuery): Promise<JobSummary[]> {
  return db.sql<JobSummary>`
    SELECT id::text AS job_id, type, key, state, attempt, fence::text AS fence, owner,
           CASE WHEN state = 'running' THEN GREATEST(0, floor(extract(epoch FROM (lease_until - now())) * 1000))::bigint::integer END AS remaining_lease_ms,
           cancel_requested, error_code, cursor_length,
           to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_at,
           to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS started_at,
           to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS finished_at,
           to_char(run_after AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS run_after
    FROM fg_jobs
    WHERE tenant = ${q.tenant}
      AND (${q.state ?? null}::text IS NULL OR state = ${q.state ?? null})
      AND (${q.type ?? null}::text IS NULL OR type = ${q.type ?? null})
      AND (${q.before ?? null}::bigint IS NULL OR id < ${q.before ?? null}::bigint)
    ORDER BY fg_jobs.id DESC
    LIMIT ${q.limit}`
}

/** One job of a tenant with its result and error, or undefined. */
export async function getJobDetail(db: Db, tenant: string, jobId: string): Promise<JobDetail | undefined> {
  const [row] = await db.sql<JobDetail>`
    SELECT id::text AS job_id, type, key, state, attempt, fence::text AS fence, owner,
           CASE WHEN state = 'running' THEN GREATEST(0, floor(extract(epoch FROM (lease_until - now())) * 1000))::bigint::integer END AS remaining_lease_ms,
           cancel_requested, error_code, cursor_length,
           to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_at,
           to_char(started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS started_at,
           to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS finished_at,
           to_char(run_after AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS run_after,
           result, error
    FROM fg_jobs WHERE id = ${jobId}::bigint AND tenant = ${tenant}`
  return row
}
