import type { Db } from '../store/db.js'

/** The most finished jobs one purge deletes: one short statement, whatever the backlog of old jobs. */
export const purgeBatch = 1000

/**
 * Deletes up to `limit` jobs that finished (succeeded, failed or cancelled) more than
 * `retentionMs` ago by the database clock, oldest first, with their output chunks (the
 * chunks' foreign key cascades). One statement on the fg_jobs_finished index, so a
 * purge reads only what it deletes; rows another transaction holds are skipped, and the
 * DELETE re-checks state and age, so a job restarted meanwhile stays. Resolves to the
 * number of jobs deleted: a full batch means more are due, and the next purge takes them.
 *
 * @example
 * const deleted = await purgeFinishedJobs(db, 7 * 86_400_000, 1000)
 */
export async function purgeFinishedJobs(db: Db, retentionMs: number, limit = purgeBatch): Promise<number> {
  const rows = await db.sql<{ id: string }>`
    WITH doomed AS (
      SELECT id FROM fg_jobs
      WHERE state IN ('succeeded', 'failed', 'cancelled') AND finished_at < now() - ${retentionMs}::bigint * interval '1 millisecond'
      ORDER BY finished_at, id LIMIT ${limit} FOR UPDATE SKIP LOCKED
    )
    DELETE FROM fg_jobs AS j USING doomed AS d
    WHERE j.id = d.id AND j.state IN ('succeeded', 'failed', 'cancelled') AND j.finished_at < now() - ${retentionMs}::bigint * interval '1 millisecond'
    RETURNING j.id::text AS id`
  return rows.length
}
