import type { Db } from '../store/db.js'
import { jobsChannel } from './wake.js'

// What an operator may do to a job from the admin plane (fencegate:admin): cancel it, end
// its lease now, or run a finished one again. Each is one statement whose WHERE re-checks
// the state it acts on, and each writes its audit row (the operator's identity in
// `caller`) in that statement, so an action is never done without its trace or traced
// without being done. Entity `job:{id}`: the job's fence history lives under that name.
// The audit CTE is written out in each statement: the Db seam binds values, not fragments.

/** Who acts, on which job. */
export interface OperatorAction {
  tenant: string
  jobId: string
  caller: string | null
  requestId: string
  /** The trace of the admin request, for the audit row; null or absent when untraced. */
  traceId?: string | null
}

/** What the action left: the job's state and fence after it. */
export interface OperatorResult {
  state: string
  fence: string
}

/** The audit codes of the three actions. */
export type OperatorCode = 'job_cancelled' | 'job_released' | 'job_retried'

/**
 * Cancels a job as an operator: a queued job is cancelled at once; a running one has its
 * cancel requested, which its holder's next heartbeat answers (`cancel_requested: true`),
 * and its release or fail then ends the job `cancelled`, as the job API's cancel does.
 * Undefined when the job is missing or already finished.
 *
 * @example
 * const r = await cancelAsOperator(db, { tenant: 'default', jobId: '42', caller: 'oncall', requestId: 'r1' })
 */
export async function cancelAsOperator(db: Db, a: OperatorAction): Promise<OperatorResult | undefined> {
  const [row] = await db.sql<OperatorResult>`
    WITH acted AS (
      UPDATE fg_jobs SET cancel_requested = true,
        state = CASE WHEN state = 'queued' THEN 'cancelled' ELSE state END,
        finished_at = CASE WHEN state = 'queued' THEN now() ELSE finished_at END
      WHERE id = ${a.jobId}::bigint AND tenant = ${a.tenant} AND state IN ('queued', 'running')
      RETURNING id, state, fence
    ), audited AS (
      INSERT INTO fg_audit (tenant, route, entity, code, highest_fence, method, path, caller, request_id, trace_id)
      SELECT ${a.tenant}, NULL, 'job:' || id::text, 'job_cancelled', fence, 'POST', '/jobs/' || id::text || '/cancel', ${a.caller}, ${a.requestId}, ${a.traceId}::text
      FROM acted RETURNING id
    )
    SELECT state, fence::text AS fence FROM acted CROSS JOIN (SELECT count(*) FROM audited) AS w`
  return row
}

/**
 * Ends a running job's lease now, whoever holds it: the job is queued again (or
 * cancelled, when a cancel is pending) and claimable at once, the next claim gets it with
 * a higher fence, and the old holder's next heartbeat, append or completion is refused
 * (`409 lease_lost`). The attempt is not counted, as when a holder releases. Undefined
 * when the job is missing or not running.
 *
 * @example
 * const r = await releaseAsOperator(db, { tenant: 'default', jobId: '42', caller: 'oncall', requestId: 'r1' })
 */
export async function releaseAsOperator(db: Db, a: OperatorAction): Promise<OperatorResult | undefined> {
  const [row] = await db.sql<OperatorResult>`
    WITH acted AS (
      UPDATE fg_jobs SET
        state = CASE WHEN cancel_requested THEN 'cancelled' ELSE 'queued' END,
        finished_at = CASE WHEN cancel_requested THEN now() END,
        attempt = CASE WHEN cancel_requested THEN attempt ELSE attempt - 1 END,
        run_after = now(), owner = NULL, lease_until = NULL
      WHERE id = ${a.jobId}::bigint AND tenant = ${a.tenant} AND state = 'running'
      RETURNING id, state, fence, type
    ), woken AS (
      SELECT pg_notify(${jobsChannel}, type || ':' || ${a.tenant}::text) FROM acted WHERE state = 'queued'
    ), audited AS (
      INSERT INTO fg_audit (tenant, route, entity, code, highest_fence, method, path, caller, request_id, trace_id)
      SELECT ${a.tenant}, NULL, 'job:' || id::text, 'job_released', fence, 'POST', '/jobs/' || id::text || '/release', ${a.caller}, ${a.requestId}, ${a.traceId}::text
      FROM acted RETURNING id
    )
    SELECT state, fence::text AS fence FROM acted
    CROSS JOIN (SELECT count(*) FROM audited) AS w CROSS JOIN (SELECT count(*) FROM woken) AS n`
  return row
}

/**
 * Runs a failed or cancelled job again: queued now, a new attempt cycle (attempt 0, no
 * result, error or output), as a start with `"restart": true` does; its fence keeps
 * rising, so no holder of an earlier cycle can write. Undefined when the job is missing
 * or not failed or cancelled.
 *
 * @example
 * const r = await retryAsOperator(db, { tenant: 'default', jobId: '42', caller: 'oncall', requestId: 'r1' })
 */
export async function retryAsOperator(db: Db, a: OperatorAction): Promise<OperatorResult | undefined> {
  const [row] = await db.sql<OperatorResult>`
    WITH acted AS (
      UPDATE fg_jobs SET state = 'queued', attempt = 0, owner = NULL, lease_until = NULL, started_at = NULL,
        run_after = now(), cancel_requested = false, result = NULL, error = NULL, error_code = NULL,
        finished_at = NULL, cursor_length = 0
      WHERE id = ${a.jobId}::bigint AND tenant = ${a.tenant} AND state IN ('failed', 'cancelled')
      RETURNING id, state, fence, type
    ), cleared AS (
      DELETE FROM fg_job_chunks AS c USING acted WHERE c.job_id = acted.id
    ), woken AS (
      SELECT pg_notify(${jobsChannel}, type || ':' || ${a.tenant}::text) FROM acted
    ), audited AS (
      INSERT INTO fg_audit (tenant, route, entity, code, highest_fence, method, path, caller, request_id, trace_id)
      SELECT ${a.tenant}, NULL, 'job:' || id::text, 'job_retried', fence, 'POST', '/jobs/' || id::text || '/retry', ${a.caller}, ${a.requestId}, ${a.traceId}::text
      FROM acted RETURNING id
    )
    SELECT state, fence::text AS fence FROM acted
    CROSS JOIN (SELECT count(*) FROM audited) AS w CROSS JOIN (SELECT count(*) FROM woken) AS n`
  return row
}
