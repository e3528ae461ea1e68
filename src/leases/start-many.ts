import type { Db } from '../store/db.js'
import type { JobState } from './types.js'
import { jobsChannel } from './wake.js'

/** The most jobs one bulk start takes. */
export const maxBulkStart = 1000

/** One job of a bulk start: the same fields as a single start. */
export interface StartItem {
  type: string
  key: string
  payload?: unknown
  restart?: boolean
}

/** What became of one item, in the order given: created, joined (queued or running) or already finished. */
export interface Started {
  job_id: string
  state: JobState
  created: boolean
  result: unknown
}

/**
 * Starts up to {@link maxBulkStart} jobs, each by its natural key, in one statement:
 * each one is created, or joins the job its key already has, exactly as a single start
 * would (with `restart`, a failed or cancelled job starts a new attempt cycle). Rows are
 * written in (type, key) order, so two bulk starts that share keys lock them in the same
 * order and cannot deadlock. Keys must be distinct within one call.
 *
 * @example
 * const started = await startJobs(db, 'default', [{ type: 'report', key: 'acme:2026-08' }, { type: 'report', key: 'globex:2026-08' }])
 */
export async function startJobs(db: Db, tenant: string, items: StartItem[]): Promise<Started[]> {
  if (items.length === 0) return []
  if (items.length > maxBulkStart) throw new RangeError(`at most ${maxBulkStart} jobs per bulk start`)
  const rows = JSON.stringify(items.map((it, i) => ({ i, type: it.type, key: it.key, payload: it.payload ?? null, restart: it.restart ?? false })))
  // Two inserts, so each row's ON CONFLICT can say whether it restarts: a plain start only joins
  // (the no-op update returns the row, locked, even when another transaction inserted it meanwhile).
  const answers = await db.sql<Started & { i: number }>`
    WITH input AS (
      SELECT * FROM jsonb_to_recordset(${rows}::text::jsonb) AS t(i integer, type text, key text, payload jsonb, restart boolean)
    ), joined AS (
      INSERT INTO fg_jobs AS j (tenant, type, key, payload, state)
      SELECT ${tenant}, type, key, payload, 'queued' FROM input WHERE NOT restart ORDER BY type, key
      ON CONFLICT (tenant, type, key) DO UPDATE SET state = j.state
      RETURNING id, type, key, state, (xmax = 0) AS created, result, attempt, cursor_length
    ), restarted AS (
      INSERT INTO fg_jobs AS j (tenant, type, key, payload, state)
      SELECT ${tenant}, type, key, payload, 'queued' FROM input WHERE restart ORDER BY type, key
      ON CONFLICT (tenant, type, key) DO UPDATE SET
        (state, attempt, owner, lease_until, started_at, run_after, cancel_requested, result, error, error_code, finished_at, payload, cursor_length) = (
          SELECT state, attempt, owner, lease_until, started_at, run_after, cancel_requested, result, error, error_code, finished_at, payload, cursor_length FROM (
            SELECT 0 AS pick, 'queued' AS state, 0 AS attempt, NULL::text AS owner, NULL::timestamptz AS lease_until, NULL::timestamptz AS started_at,
                   now() AS run_after, false AS cancel_requested, NULL::jsonb AS result, NULL::jsonb AS error, NULL::text AS error_code,
                   NULL::timestamptz AS finished_at, EXCLUDED.payload AS payload, 0 AS cursor_length
            WHERE j.state IN ('failed', 'cancelled')
            UNION ALL
            SELECT 1, j.state, j.attempt, j.owner, j.lease_until, j.started_at, j.run_after, j.cancel_requested, j.result, j.error, j.error_code, j.finished_at, j.payload, j.cursor_length
          ) AS choice ORDER BY pick LIMIT 1)
      RETURNING id, type, key, state, (xmax = 0) AS created, result, attempt, cursor_length
    ), cleared AS (
      -- A restarted cycle (attempt and cursor back to 0) starts with no output, as in startJob.
      DELETE FROM fg_job_chunks AS c USING restarted AS s
      WHERE c.job_id = s.id AND s.state = 'queued' AND s.attempt = 0 AND s.cursor_length = 0
    ), woken AS (
      -- One notification per type is enough to wake its waiting claims (src/leases/wake.ts).
      SELECT pg_notify(${jobsChannel}, type || ':' || ${tenant}::text) FROM (
        SELECT type FROM joined WHERE created UNION SELECT type FROM restarted WHERE state = 'queued') AS t
    ), started AS (
      SELECT * FROM joined UNION ALL SELECT * FROM restarted
    )
    SELECT input.i, s.id::text AS job_id, s.state, s.created, s.result
    FROM input JOIN started AS s ON s.type = input.type AND s.key = input.key
    CROSS JOIN (SELECT count(*) FROM woken) AS w
    ORDER BY input.i`
  return answers.map(({ i: _i, ...started }) => started)
}
