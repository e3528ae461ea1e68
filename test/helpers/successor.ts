import { FencegateClient, type Job, type Lease } from '../../src/client/index.js'
import type { Db } from '../../src/store/db.js'

/**
 * A successor takes a running job: its lease is moved into the past on the database clock and
 * another worker claims it. Two things can make that claim miss the job while its first
 * holder still runs: the holder's heartbeat may hold the job's row at that instant (claims
 * skip locked rows, as they should), and a queued job of the same type is then the next one
 * due. So queued jobs are held back while the successor claims (their order is kept: every
 * one moves by the same day), and a claim that found the row locked is sent again.
 */
export async function supersede(db: Db, baseUrl: string, a: { jobId: string; type: string; workerId?: string }): Promise<{ job: Job; lease: Lease }> {
  await db.sql`UPDATE fg_jobs SET lease_until = now() - interval '1 hour' WHERE id = ${a.jobId}::bigint`
  await db.sql`UPDATE fg_jobs SET run_after = run_after + interval '1 day' WHERE type = ${a.type} AND state = 'queued'`
  try {
    const successor = new FencegateClient({ baseUrl })
    for (let attempt = 0; attempt < 100; attempt++) {
      const next = await successor.claim({ types: [a.type], workerId: a.workerId ?? 'successor' })
      if (next) return next
    }
    throw new Error(`no successor could claim job ${a.jobId} in 100 tries`)
  } finally {
    await db.sql`UPDATE fg_jobs SET run_after = run_after - interval '1 day' WHERE type = ${a.type} AND state = 'queued'`
  }
}
