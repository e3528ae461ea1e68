import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { parseConfig } from '../src/config/schema.js'
import { purgeFinishedJobs } from '../src/leases/retention.js'
import { createJobStore } from '../src/leases/store.js'
import { backends, type TestDb } from './helpers/backends.js'

const route = { name: 'unused', method: 'POST', path: '/unused', upstream: 'http://127.0.0.1:9', fence: 'off' }
const config = parseConfig({ routes: [route], job_types: [{ name: 'report', lease: '45s', max_attempts: 1 }] })
const day = 86_400_000

describe.each(backends())('job retention on $name', (backend) => {
  let t: TestDb
  beforeEach(async () => {
    t = await backend.open()
  })
  afterEach(async () => {
    await t.close()
  })

  it('deletes jobs finished longer ago than job_retention, with their chunks, in bounded batches; keeps the rest', async () => {
    // One statement: 2,500 finished long ago (with a chunk each), and jobs that must stay.
    await t.db.sql`
      INSERT INTO fg_jobs (tenant, type, key, state, finished_at)
      SELECT 'default', 'report', 'old' || g, (ARRAY['succeeded', 'failed', 'cancelled'])[1 + g % 3], now() - interval '8 days'
      FROM generate_series(1, 2500) AS g`
    await t.db.sql`INSERT INTO fg_job_chunks (job_id, seq, chunk, fence) SELECT id, 0, '{}'::jsonb, 1 FROM fg_jobs`
    await t.db.sql`
      INSERT INTO fg_jobs (tenant, type, key, state, finished_at, owner, lease_until, fence, attempt) VALUES
        ('default', 'report', 'recent', 'succeeded', now() - interval '6 days', NULL, NULL, 1, 1),
        ('default', 'report', 'queued', 'queued', NULL, NULL, NULL, 0, 0),
        ('default', 'report', 'running', 'running', NULL, 'w', now() + interval '1 minute', 1, 1)`
    const deleted: number[] = []
    for (;;) {
      const n = await purgeFinishedJobs(t.db, 7 * day, 1000)
      deleted.push(n)
      if (n < 1000) break
    }
    expect(deleted).toEqual([1000, 1000, 500])
    const left = await t.db.sql<{ key: string }>`SELECT key FROM fg_jobs ORDER BY key`
    expect(left.map((r) => r.key)).toEqual(['queued', 'recent', 'running'])
    const [chunks] = await t.db.sql<{ n: number }>`SELECT count(*)::int AS n FROM fg_job_chunks`
    expect(chunks!.n).toBe(0)
  })

  it('frees the natural key: a start after the purge creates a new job', async () => {
    const jobs = createJobStore(t.db)
    const first = await jobs.startJob({ tenant: 'default', type: 'report', key: 'k', payload: null, restart: false })
    const claimed = await jobs.claimOne({ tenant: 'default', workerId: 'w', types: config.job_types })
    await jobs.complete({ tenant: 'default', jobId: claimed!.job_id, workerId: 'w', fence: claimed!.fence }, { ok: 1 }, { requestId: 'r', caller: null, path: 'p' })
    expect(await jobs.purgeFinished(config.job_retention)).toBe(0)
    expect((await jobs.startJob({ tenant: 'default', type: 'report', key: 'k', payload: null, restart: false })).state).toBe('succeeded')
    await t.db.sql`UPDATE fg_jobs SET finished_at = now() - interval '7 days 1 second'`
    expect(await jobs.purgeFinished(config.job_retention)).toBe(1)
    const again = await jobs.startJob({ tenant: 'default', type: 'report', key: 'k', payload: null, restart: false })
    expect([again.created, again.job_id === first.job_id]).toEqual([true, false])
  })

  it('job_retention defaults to 7d and refuses less than an hour', () => {
    expect(config.job_retention).toBe(7 * day)
    expect(parseConfig({ routes: [route], job_retention: '30d' }).job_retention).toBe(30 * day)
    expect(() => parseConfig({ routes: [route], job_retention: '5m' })).toThrow(/at least 1h/)
  })
})
