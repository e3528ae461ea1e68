import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { parseConfig } from '../src/config/schema.js'
import { createJobStore, type Holder, type JobStore } from '../src/leases/store.js'
import type { Db } from '../src/store/db.js'
import { backends, type TestDb } from './helpers/backends.js'

// Issue 15: a completion is one job's statement, yet it cost more the more jobs had run.
// Its plain `state = 'running' AND lease_until > now()` let the planner reach the row
// through fg_jobs_expiring when the statistics had seen few running jobs, and walk every
// dead entry that finished jobs leave there (migrations/0011). These tests analyze a
// backlog, run jobs through it, then count which indexes each holder statement scans,
// on the transaction's own statistics counters (exact on both stores, timing-free).

const types = parseConfig({
  routes: [{ name: 'unused', method: 'POST', path: '/unused', upstream: 'http://127.0.0.1:9', fence: 'off' }],
  job_types: [{ name: 'report', lease: '45s', max_attempts: 3 }],
}).job_types
const depth = 2_000
const finished = 200
const audit = { requestId: 'r', caller: null, path: '/_fencegate/jobs/complete' }

/** Index scans on fg_jobs by the statements `run` sends, by index name: read from the transaction's own counters. */
async function indexScans(db: Db, run: (tx: Db) => Promise<unknown>): Promise<Record<string, number>> {
  return db.begin(async (tx) => {
    const read = async () => new Map((await tx.sql<{ name: string; scans: number }>`
      SELECT i.indexrelid::regclass::text AS name, pg_stat_get_xact_numscans(i.indexrelid)::integer AS scans
      FROM pg_index AS i WHERE i.indrelid = 'fg_jobs'::regclass`).map((r) => [r.name, r.scans]))
    const before = await read()
    await run(tx)
    const after = await read()
    return Object.fromEntries([...after].map(([name, n]) => [name, n - (before.get(name) ?? 0)]).filter(([, n]) => n !== 0))
  })
}

describe.each(backends())('holder statements reach the job by primary key at any depth, on $name', (backend) => {
  let t: TestDb
  let jobs: JobStore

  async function claim(workerId: string): Promise<Holder> {
    const [c] = await jobs.claimJobs({ tenant: 'default', workerId, types })
    expect(c?.state).toBe('running')
    return { tenant: 'default', workerId, jobId: c!.job_id, fence: c!.fence }
  }

  beforeEach(async () => {
    t = await backend.open()
    jobs = createJobStore(t.db, { schedule: setImmediate })
    await t.db.sql`
      INSERT INTO fg_jobs (tenant, type, key, payload, state)
      SELECT 'default', 'report', 'k' || g, '{}'::jsonb, 'queued' FROM generate_series(1, ${depth}) AS g`
    // The statistics of a backlog: no job running. This is what made fg_jobs_expiring look cheap.
    await t.db.sql`ANALYZE fg_jobs`
    for (let n = 0; n < finished; n++) {
      const h = await claim('w')
      expect(await jobs.complete(h, { n }, audit)).toEqual({ completed: true, repeated: false })
    }
  })
  afterEach(async () => {
    await t.close()
  })

  it('renewal, append, the lease check, completion (also repeated and refused), release and fail scan only the primary key', async () => {
    const [h, released, failed] = [await claim('w1'), await claim('w2'), await claim('w3')]
    const steps: [string, (tx: Db) => Promise<unknown>][] = [
      ['heartbeat', (tx) => createJobStore(tx).heartbeat(h, types)],
      ['append', (tx) => createJobStore(tx).append(h, 0, { part: 1 })],
      ['fg_lease_live', (tx) => tx.sql`SELECT fg_lease_live(${h.tenant}, ${h.jobId}::bigint, ${h.fence}::bigint, NULL)`],
      ['failOverRuntime', (tx) => createJobStore(tx).failOverRuntime(h, types)],
      ['complete', (tx) => createJobStore(tx).complete(h, { done: true }, audit)],
      ['complete again', (tx) => createJobStore(tx).complete(h, { done: true }, audit)],
      ['complete otherwise', (tx) => createJobStore(tx).complete(h, { done: false }, audit)],
      ['release', (tx) => createJobStore(tx).release(released)],
      ['fail', (tx) => createJobStore(tx).fail(failed, types, { oops: true }, true)],
    ]
    const scanned: { step: string; indexes: string[] }[] = []
    for (const [step, run] of steps) scanned.push({ step, indexes: Object.keys(await indexScans(t.db, run)) })
    expect(scanned).toEqual(steps.map(([step]) => ({ step, indexes: ['fg_jobs_pkey'] })))
    // The steps did what they say: the statements above are the ones that decide.
    expect((await jobs.getJob('default', h.jobId))?.state).toBe('succeeded')
    expect((await jobs.getJob('default', released.jobId))?.state).toBe('queued')
    expect((await jobs.getJob('default', failed.jobId))?.state).toBe('queued')
  })
})
