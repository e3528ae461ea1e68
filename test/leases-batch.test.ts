import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { createJobStore } from '../src/leases/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'

const jobTypes = [{ name: 'report', lease: '45s', max_attempts: 3 }, { name: 'other', lease: '30s' }]

describe.each(backends())('batch claims and bulk starts on $name', (backend) => {
  let t: TestDb
  let gw: TestGateway

  beforeEach(async () => {
    t = await backend.open()
    gw = await startTestGateway({ config: testConfig([route('http://127.0.0.1:9')], { job_types: jobTypes }), store: t.store, jobs: createJobStore(t.db) })
  })
  afterEach(async () => {
    await gw.close()
    await t.close()
  })

  async function call(path: string, body?: unknown, method = 'POST') {
    const res = await fetch(`${gw.url}/_fencegate/jobs${path}`, { method, headers: { 'content-type': 'application/json' }, ...(body === undefined ? {} : { body: JSON.stringify(body) }) })
    const text = await res.text()
    return { status: res.status, json: text ? JSON.parse(text) : undefined }
  }
  const bulk = (jobs: unknown[]) => call('/bulk', { jobs })
  const keys = (n: number, prefix = 'k') => Array.from({ length: n }, (_, i) => ({ type: 'report', key: `${prefix}${i}`, payload: { n: i } }))

  it('a batch claim takes the earliest jobs in one statement, each with its own fence and lease', async () => {
    const started = await bulk(keys(25))
    expect(started.status).toBe(200)
    // One statement, so one run_after for all: the claim order is then the job id's, which follows (type, key) order.
    const ids = started.json.jobs.map((j: { job_id: string }) => j.job_id).sort((x: string, y: string) => Number(x) - Number(y))
    const first = await call('/claim', { worker_id: 'w1', max: 10 })
    expect(first.status).toBe(200)
    expect(first.json.jobs.map((j: { job_id: string }) => j.job_id)).toEqual(ids.slice(0, 10))
    for (const j of first.json.jobs) expect(j).toMatchObject({ type: 'report', fence: '1', attempt: 1, lease_ms: 45_000, lease_remaining_ms: 45_000 })
    const rest = await call('/claim', { worker_id: 'w2', max: 100 })
    expect(rest.json.jobs.map((j: { job_id: string }) => j.job_id)).toEqual(ids.slice(10))
    expect((await call('/claim', { worker_id: 'w3', max: 5 })).status).toBe(204)
    // Each lease is the job's own: renewing or completing one touches no other.
    const [a, b] = first.json.jobs
    expect((await call(`/${a.job_id}/complete`, { worker_id: 'w1', fence: a.fence, result: { ok: 1 } })).status).toBe(200)
    expect((await call(`/${b.job_id}/heartbeat`, { worker_id: 'w1', fence: b.fence })).status).toBe(200)
    expect((await call(`/${b.job_id}/complete`, { worker_id: 'w2', fence: b.fence })).json.code).toBe('not_owner')
    const states = await t.db.sql<{ state: string; n: number }>`SELECT state, count(*)::int AS n FROM fg_jobs GROUP BY state ORDER BY state`
    expect(states).toEqual([{ state: 'running', n: 24 }, { state: 'succeeded', n: 1 }])
  })

  it('a claim PostgreSQL rolled back to break a deadlock is claimed again (regression: the 100,000-deep bench died on 40P01)', async () => {
    await bulk(keys(12))
    // A real 40P01 from the database, raised by a trigger on the claim's update while `fail_next` is above zero:
    // a sequence, so the count survives the rollback the error causes.
    await t.db.sql`CREATE SEQUENCE fail_next MINVALUE 0 START 0`
    await t.db.sql`CREATE FUNCTION deadlock_on_update() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF (SELECT last_value FROM fail_next) > 0 THEN
          PERFORM setval('fail_next', (SELECT last_value FROM fail_next) - 1);
          RAISE EXCEPTION 'deadlock (test)' USING ERRCODE = '40P01';
        END IF;
        RETURN NEW;
      END $$`
    await t.db.sql`CREATE TRIGGER deadlock_on_update BEFORE UPDATE ON fg_jobs FOR EACH ROW EXECUTE FUNCTION deadlock_on_update()`
    const failNext = (n: number) => t.db.sql`SELECT setval('fail_next', ${n}, true)`
    await failNext(2)
    const one = await call('/claim', { worker_id: 'w1' })
    expect([one.status, one.json.fence, one.json.attempt]).toEqual([200, '1', 1])
    await failNext(2)
    const batch = await call('/claim', { worker_id: 'w2', max: 10 })
    expect([batch.status, batch.json.jobs.length]).toEqual([200, 10])
    // Three rollbacks in a row: the claim gives up as a store failure and takes nothing.
    await failNext(3)
    expect((await call('/claim', { worker_id: 'w3' })).json).toMatchObject({ status: 503, code: 'store_unavailable' })
    const taken = await t.db.sql<{ state: string; fence: string; n: number }>`
      SELECT state, fence::text AS fence, count(*)::int AS n FROM fg_jobs GROUP BY state, fence ORDER BY state`
    expect(taken).toEqual([{ state: 'queued', fence: '0', n: 1 }, { state: 'running', fence: '1', n: 11 }])
  })

  it('concurrent batch claims never hand one job to two workers', async () => {
    expect((await bulk(keys(200))).status).toBe(200)
    const got: string[][] = Array.from({ length: 8 }, () => [])
    await Promise.all(got.map(async (mine, w) => {
      for (;;) {
        const r = await call('/claim', { worker_id: `w${w}`, max: 7 })
        if (r.status === 204) return
        for (const j of r.json.jobs) mine.push(j.job_id)
      }
    }))
    const all = got.flat()
    expect(all).toHaveLength(200)
    expect(new Set(all).size).toBe(200)
    const [row] = await t.db.sql<{ n: number }>`SELECT count(*)::int AS n FROM fg_jobs WHERE state = 'running' AND fence = 1 AND attempt = 1`
    expect(row!.n).toBe(200)
  })

  it('a bulk start answers each job as a single start would: created, joined, completed or finished', async () => {
    const store = createJobStore(t.db)
    const types = testConfig([route('http://127.0.0.1:9')], { job_types: jobTypes }).job_types
    await call('', { type: 'report', key: 'done' })
    await call('', { type: 'report', key: 'failed' })
    await call('', { type: 'report', key: 'failed-restart' })
    for (const key of ['done', 'failed', 'failed-restart']) {
      const [c] = await store.claimJobs({ tenant: 'default', workerId: 'w', types, max: 1 })
      const h = { tenant: 'default', jobId: c!.job_id, workerId: 'w', fence: c!.fence }
      if (key === 'done') await store.complete(h, { pdf: 1 }, { requestId: 'r', caller: null, path: 'p' })
      else await store.fail(h, types, { e: 1 }, false)
    }
    await call('', { type: 'report', key: 'queued', payload: { v: 1 } })
    const r = await bulk([
      { type: 'report', key: 'new', payload: { v: 2 } }, { type: 'report', key: 'queued', payload: { v: 3 } }, { type: 'report', key: 'done' },
      { type: 'report', key: 'failed' }, { type: 'report', key: 'failed-restart', restart: true }, { type: 'other', key: 'new' },
    ])
    expect(r.status).toBe(200)
    expect(r.json.jobs).toMatchObject([
      { state: 'queued', created: true }, { state: 'queued', joined: true }, { state: 'succeeded', result: { pdf: 1 } },
      { state: 'failed', code: 'job_finished' }, { state: 'queued', joined: true }, { state: 'queued', created: true },
    ])
    // A join keeps the first payload, as a single start does.
    expect((await call(`/${r.json.jobs[1].job_id}`, undefined, 'GET')).json).toMatchObject({ key: 'queued', attempt: 0 })
    const [payload] = await t.db.sql<{ payload: unknown }>`SELECT payload FROM fg_jobs WHERE key = 'queued'`
    expect(payload!.payload).toEqual({ v: 1 })
  })

  it('concurrent bulk starts over the same keys in opposite orders get one job per key, created once, without deadlock', async () => {
    const forward = keys(300)
    const answers = await Promise.all([bulk(forward), bulk([...forward].reverse()), bulk(forward.slice(100, 200))])
    for (const a of answers) expect(a.status).toBe(200)
    const byKey = new Map<string, { ids: Set<string>; created: number }>()
    answers.forEach((a, n) => {
      const sent = n === 0 ? forward : n === 1 ? [...forward].reverse() : forward.slice(100, 200)
      a.json.jobs.forEach((j: { job_id: string; created?: boolean }, i: number) => {
        const e = byKey.get(sent[i]!.key) ?? { ids: new Set(), created: 0 }
        e.ids.add(j.job_id)
        if (j.created) e.created++
        byKey.set(sent[i]!.key, e)
      })
    })
    expect(byKey.size).toBe(300)
    for (const e of byKey.values()) expect([e.ids.size, e.created]).toEqual([1, 1])
  })

  it('refuses a malformed batch whole, starting nothing', async () => {
    expect((await bulk([{ type: 'report', key: 'a' }, { type: 'report', key: 'a' }])).json).toMatchObject({ code: 'invalid_request' })
    expect((await bulk(keys(1001))).json).toMatchObject({ code: 'invalid_request' })
    expect((await bulk([])).json).toMatchObject({ code: 'invalid_request' })
    expect((await bulk([{ type: 'report', key: 'a' }, { type: 'nope', key: 'b' }])).json).toMatchObject({ code: 'unknown_job_type' })
    expect((await call('/claim', { worker_id: 'w', max: 101 })).json).toMatchObject({ code: 'invalid_request' })
    expect((await call('/claim', { worker_id: 'w', max: 0 })).json).toMatchObject({ code: 'invalid_request' })
    const [row] = await t.db.sql<{ n: number }>`SELECT count(*)::int AS n FROM fg_jobs`
    expect(row!.n).toBe(0)
  })
})
