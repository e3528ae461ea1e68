import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import type { Db } from '../src/store/db.js'
import { createJobStore } from '../src/leases/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, testConfig } from './helpers/gateway.js'

const types = testConfig([route('http://127.0.0.1:9')], { job_types: [{ name: 'report', lease: '45s' }] }).job_types
const audit = { requestId: 'r', caller: null, path: '/_fencegate/jobs/x/complete' }

describe.each(backends())('job completions of one turn on $name', (backend) => {
  let t: TestDb
  let statements: number
  let db: Db

  beforeEach(async () => {
    t = await backend.open()
    statements = 0
    // Counts the statements the completions send, and nothing else changes.
    db = { ...t.db, sql: (strings, ...values) => (statements++, t.db.sql(strings, ...values)) }
  })
  afterEach(async () => {
    await t.close()
  })

  /** `n` claimed jobs and their holders, claimed outside the counted Db. */
  async function claimed(n: number) {
    const store = createJobStore(t.db)
    await store.startJobs('default', Array.from({ length: n }, (_, i) => ({ type: 'report', key: `k${i}` })))
    const got = await store.claimJobs({ tenant: 'default', workerId: 'w', types, max: n })
    return got.map((c) => ({ tenant: 'default', jobId: c.job_id, workerId: 'w', fence: c.fence }))
  }

  it('share one statement, each decided as alone: completed, or refused and audited', async () => {
    const [a, b, c] = await claimed(3)
    const jobs = createJobStore(db)
    const outcomes = await Promise.all([
      jobs.complete(a!, { n: 1 }, audit),
      jobs.complete({ ...b!, fence: String(Number(b!.fence) + 1) }, { n: 2 }, audit), // not this job's fence
      jobs.complete({ ...c!, workerId: 'intruder' }, { n: 3 }, audit), // not its holder
    ])
    expect(statements).toBe(1)
    expect(outcomes).toEqual([{ completed: true, repeated: false }, { completed: false, repeated: false }, { completed: false, repeated: false }])
    const rejected = await t.db.sql<{ entity: string }>`SELECT entity FROM fg_audit WHERE code = 'result_rejected' ORDER BY entity`
    expect(rejected.map((r) => r.entity)).toEqual([`job:${b!.jobId}`, `job:${c!.jobId}`].sort())
    const states = await t.db.sql<{ state: string }>`SELECT state FROM fg_jobs ORDER BY id`
    expect(states.map((s) => s.state)).toEqual(['succeeded', 'running', 'running'])
  })

  it('decide a job completed twice in one turn in order: the same result is a repeat, another is refused', async () => {
    const [a] = await claimed(1)
    const jobs = createJobStore(db)
    const outcomes = await Promise.all([
      jobs.complete(a!, { n: 1 }, audit),
      jobs.complete(a!, { n: 1 }, audit),
      jobs.complete(a!, { n: 2 }, audit),
    ])
    expect(outcomes).toEqual([{ completed: true, repeated: false }, { completed: false, repeated: true }, { completed: false, repeated: false }])
    const [row] = await t.db.sql<{ result: unknown }>`SELECT result FROM fg_jobs`
    expect(row!.result).toEqual({ n: 1 })
    const [n] = await t.db.sql<{ n: number }>`SELECT count(*)::int AS n FROM fg_audit WHERE code = 'result_rejected'`
    expect(n!.n).toBe(1)
  })

  it('store a null result as JSON null, as a completion without a result always did', async () => {
    const [a] = await claimed(1)
    const jobs = createJobStore(db)
    expect(await jobs.complete(a!, undefined, audit)).toEqual({ completed: true, repeated: false })
    const [row] = await t.db.sql<{ is_json_null: boolean }>`SELECT result = 'null'::jsonb AS is_json_null FROM fg_jobs`
    expect(row!.is_json_null).toBe(true)
  })
})
