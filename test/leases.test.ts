import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { createApp } from '../src/gateway/app.js'
import { createJobStore } from '../src/leases/store.js'
import { createClaimWake } from '../src/leases/wake.js'
import { createUndiciForward } from '../src/runtime/node/forward.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

const jobTypes = [
  { name: 'report', lease: '45s', max_attempts: 3, backoff: '10s', max_runtime: '30m' },
  { name: 'other', lease: '45s' },
]

describe.each(backends())('lease service on $name', (backend) => {
  let t: TestDb
  let gw: TestGateway

  beforeEach(async () => {
    t = await backend.open()
    gw = await startTestGateway({
      config: testConfig([route('http://127.0.0.1:9')], { job_types: jobTypes }),
      store: t.store,
      jobs: createJobStore(t.db),
    })
  })
  afterEach(async () => {
    await gw.close()
    await t.close()
  })

  async function call(path: string, body?: unknown, method = 'POST') {
    const res = await fetch(`${gw.url}/_fencegate/jobs${path}`, {
      method, headers: { 'content-type': 'application/json' }, ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    })
    const text = await res.text()
    return { status: res.status, json: text ? JSON.parse(text) : undefined }
  }
  const start = (key: string, extra: Record<string, unknown> = {}) => call('', { type: 'report', key, payload: { month: key }, ...extra })
  const claim = (worker: string, extra: Record<string, unknown> = {}) => call('/claim', { worker_id: worker, ...extra })
  /** Moves a job's lease into the past on the database clock: what waiting out the lease would do. */
  const expire = (jobId: string) => t.db.sql`UPDATE fg_jobs SET lease_until = now() - interval '1 second' WHERE id = ${jobId}::bigint`

  it('starts a job once per natural key; a second start joins it, also when concurrent', async () => {
    const first = await start('customer_health:2026-08')
    expect([first.status, first.json.state, first.json.created]).toEqual([201, 'queued', true])
    const again = await start('customer_health:2026-08')
    expect([again.status, again.json.job_id, again.json.joined]).toEqual([200, first.json.job_id, true])
    const storm = await Promise.all(Array.from({ length: 20 }, () => start('customer_health:2026-09')))
    expect(new Set(storm.map((s) => s.json.job_id)).size).toBe(1)
    expect(storm.filter((s) => s.status === 201)).toHaveLength(1)
    expect((await call('', { type: 'nope', key: 'k' })).json.code).toBe('unknown_job_type')
  })

  it('a claim names at most 32 job types, and a type named twice is claimed as one (a 1 MiB list of names cost an index scan each, every round)', async () => {
    const many = await claim('w1', { types: Array.from({ length: 33 }, () => 'report') })
    expect([many.status, many.json.code]).toEqual([400, 'invalid_request'])
    await start('dup')
    const claimed = await claim('w1', { types: ['report', 'report', 'report'], max: 5 })
    expect(claimed.status).toBe(200)
    expect(claimed.json.jobs).toHaveLength(1)
  })

  it('claims with a new fence, skips a live lease and reclaims an expired one with a higher fence', async () => {
    const { json: job } = await start('k1')
    const a = await claim('w1')
    expect(a.json).toMatchObject({ job_id: job.job_id, type: 'report', payload: { month: 'k1' }, fence: '1', attempt: 1, cursor_length: 0 })
    // Durations by the database, in the claim statement: lease_until is now() + lease, so all of it is left.
    expect([a.json.lease_ms, a.json.lease_remaining_ms]).toEqual([45_000, 45_000])
    expect((await claim('w2')).status).toBe(204)
    await expire(job.job_id)
    const b = await claim('w2')
    expect(b.json).toMatchObject({ job_id: job.job_id, fence: '2', attempt: 2 })
    const view = await call(`/${job.job_id}`, undefined, 'GET')
    expect(view.json).toMatchObject({ state: 'running', owner: 'w2', fence: '2', attempt: 2 })
    expect(view.json.remaining_lease_ms).toBeGreaterThan(40_000)
  })

  it('renews only a live lease of the holder: never after expiry, even if nobody claimed the job', async () => {
    const { json: job } = await start('k1')
    const { json: c } = await claim('w1')
    await t.db.sql`UPDATE fg_jobs SET lease_until = now() + interval '10 seconds' WHERE id = ${job.job_id}::bigint`
    const first = await call(`/${job.job_id}/heartbeat`, { worker_id: 'w1', fence: c.fence })
    expect(first.status).toBe(200)
    expect(first.json).toMatchObject({ cancel_requested: false, lease_ms: 45_000, lease_remaining_ms: 45_000 })
    // A missed heartbeat before the deadline changes nothing: the same token renews later.
    const second = await call(`/${job.job_id}/heartbeat`, { worker_id: 'w1', fence: c.fence })
    expect(second.json.lease_until >= first.json.lease_until).toBe(true)
    expect((await call(`/${job.job_id}/heartbeat`, { worker_id: 'w2', fence: c.fence })).json).toMatchObject({ code: 'lease_lost', reason: 'superseded' })
    await expire(job.job_id)
    const late = await call(`/${job.job_id}/heartbeat`, { worker_id: 'w1', fence: c.fence })
    expect([late.status, late.json.code, late.json.reason]).toEqual([409, 'lease_lost', 'expired'])
  })

  it('never shortens a stored lease', async () => {
    const { json: job } = await start('k1')
    const { json: c } = await claim('w1')
    await t.db.sql`UPDATE fg_jobs SET lease_until = now() + interval '1 hour' WHERE id = ${job.job_id}::bigint`
    const before = (await call(`/${job.job_id}`, undefined, 'GET')).json.remaining_lease_ms
    const beat = await call(`/${job.job_id}/heartbeat`, { worker_id: 'w1', fence: c.fence })
    // The remaining lease is read after the renewal: the stored hour, not the type's 45 s.
    expect(beat.json.lease_ms).toBe(45_000)
    expect(beat.json.lease_remaining_ms).toBeGreaterThan(before - 5_000)
    expect((await call(`/${job.job_id}`, undefined, 'GET')).json.remaining_lease_ms).toBeGreaterThan(before - 5_000)
  })

  it('refuses a stale completion after a reclaim, audits it, and lets the new owner complete once', async () => {
    const { json: job } = await start('k1')
    const { json: old } = await claim('w1')
    await expire(job.job_id)
    const { json: current } = await claim('w2')
    const stale = await call(`/${job.job_id}/complete`, { worker_id: 'w1', fence: old.fence, result: { pdf: 'stale' } })
    expect([stale.status, stale.json.code]).toEqual([409, 'not_owner'])
    const audit = await t.store.listAudit({ limit: 10, code: 'result_rejected' })
    expect(audit).toMatchObject([{ entity: `job:${job.job_id}`, presented_fence: '1', highest_fence: '2' }])
    expect((await call(`/${job.job_id}/complete`, { worker_id: 'w2', fence: current.fence, result: { pdf: 'fresh' } })).status).toBe(200)
    expect((await call(`/${job.job_id}/complete`, { worker_id: 'w2', fence: current.fence, result: { pdf: 'fresh' } })).status).toBe(200)
    expect((await call(`/${job.job_id}/complete`, { worker_id: 'w2', fence: current.fence, result: { pdf: 'other' } })).json.code).toBe('not_owner')
    const done = await start('k1')
    expect(done.json).toMatchObject({ state: 'succeeded', result: { pdf: 'fresh' } })
  })

  it('treats a stale fail as a no-op, and fails or requeues under the live lease', async () => {
    const { json: job } = await start('k1')
    const { json: old } = await claim('w1')
    await expire(job.job_id)
    const { json: current } = await claim('w2')
    expect((await call(`/${job.job_id}/fail`, { worker_id: 'w1', fence: old.fence, retryable: false })).json.code).toBe('lease_lost')
    expect((await call(`/${job.job_id}`, undefined, 'GET')).json).toMatchObject({ state: 'running', owner: 'w2' })
    const requeued = await call(`/${job.job_id}/fail`, { worker_id: 'w2', fence: current.fence, error: { msg: 'upstream 503' }, retryable: true })
    expect(requeued.json.state).toBe('queued')
    // Backoff: not claimable until run_after on the database clock.
    expect((await claim('w3')).status).toBe(204)
    await t.db.sql`UPDATE fg_jobs SET run_after = now() WHERE id = ${job.job_id}::bigint`
    const third = await claim('w3')
    expect(third.json).toMatchObject({ fence: '3', attempt: 3 })
    expect((await call(`/${job.job_id}/fail`, { worker_id: 'w3', fence: third.json.fence, retryable: false })).json.state).toBe('failed')
    expect((await start('k1')).json.code).toBe('job_finished')
    const restarted = await start('k1', { restart: true })
    expect([restarted.json.job_id, restarted.json.state]).toEqual([job.job_id, 'queued'])
    expect((await claim('w4')).json).toMatchObject({ job_id: job.job_id, fence: '4', attempt: 1 })
  })

  it('release requeues at once without using up an attempt; the releaser cannot renew, append or complete after it', async () => {
    const { json: job } = await start('k1')
    const { json: c } = await claim('w1')
    const w1 = { worker_id: 'w1', fence: c.fence }
    await call(`/${job.job_id}/append`, { ...w1, seq: 0, chunk: 'part' })
    expect(await call(`/${job.job_id}/release`, w1)).toEqual({ status: 200, json: { job_id: job.job_id, state: 'queued' } })
    expect((await call(`/${job.job_id}`, undefined, 'GET')).json).toMatchObject({ state: 'queued', attempt: 0, fence: '1', owner: null, remaining_lease_ms: null })
    for (const action of ['heartbeat', 'append', 'fail', 'release']) {
      const refused = await call(`/${job.job_id}/${action}`, { ...w1, ...(action === 'append' ? { seq: 1, chunk: 'late' } : action === 'fail' ? { retryable: true } : {}) })
      expect([action, refused.status, refused.json.code, refused.json.reason]).toEqual([action, 409, 'lease_lost', 'released'])
    }
    expect((await call(`/${job.job_id}/complete`, { ...w1, result: 'late' })).json).toMatchObject({ code: 'not_owner', reason: 'released' })
    // Claimable at once (no backoff), with a higher fence and the same attempt number; the output stays.
    const { json: next } = await claim('w2')
    expect(next).toMatchObject({ job_id: job.job_id, fence: '2', attempt: 1, cursor_length: 1 })
    expect((await call(`/${job.job_id}/heartbeat`, w1)).json.reason).toBe('superseded')
    // Releases never count against max_attempts (3 for this type).
    let fence = next.fence
    for (let i = 0; i < 4; i++) {
      expect((await call(`/${job.job_id}/release`, { worker_id: 'w2', fence })).status).toBe(200)
      const again = await claim('w2')
      expect([again.json.attempt, again.json.fence]).toEqual([1, String(Number(fence) + 1)])
      fence = again.json.fence
    }
    expect((await call(`/${job.job_id}/complete`, { worker_id: 'w2', fence, result: 'done' })).status).toBe(200)
  })

  it('refuses a stale or foreign release and changes nothing; a release with a cancel pending ends the job cancelled', async () => {
    const { json: job } = await start('k1')
    const { json: c } = await claim('w1')
    const row = async () => (await t.db.sql`SELECT state, owner, fence::text, attempt, lease_until, run_after, finished_at FROM fg_jobs WHERE id = ${job.job_id}::bigint`)[0]
    const before = await row()
    expect((await call(`/${job.job_id}/release`, { worker_id: 'w2', fence: c.fence })).json).toMatchObject({ code: 'lease_lost', reason: 'superseded' })
    expect((await call(`/${job.job_id}/release`, { worker_id: 'w1', fence: '7' })).json).toMatchObject({ code: 'lease_lost', reason: 'superseded' })
    expect(await row()).toEqual(before)
    await expire(job.job_id)
    const expired = await row()
    const late = await call(`/${job.job_id}/release`, { worker_id: 'w1', fence: c.fence })
    expect([late.status, late.json.code, late.json.reason]).toEqual([409, 'lease_lost', 'expired'])
    expect(await row()).toEqual(expired)
    const { json: next } = await claim('w2')
    expect((await call(`/${job.job_id}/release`, { worker_id: 'w1', fence: c.fence })).json.reason).toBe('superseded')
    expect((await call(`/${job.job_id}`, undefined, 'GET')).json).toMatchObject({ state: 'running', owner: 'w2', fence: '2', attempt: 2 })
    expect((await call('/777777/release', { worker_id: 'w1', fence: '1' })).json.code).toBe('job_not_found')
    expect((await call(`/${job.job_id}/release`, { worker_id: 'w2', fence: next.fence, error: 'x' })).json.code).toBe('invalid_request')
    await call(`/${job.job_id}/cancel`)
    expect((await call(`/${job.job_id}/release`, { worker_id: 'w2', fence: next.fence })).json.state).toBe('cancelled')
    expect((await claim('w3')).status).toBe(204)
  })

  it('a release wakes a waiting claim through the notification, not the tick', async () => {
    const jobs = createJobStore(t.db)
    // A fallback tick longer than any test: a wake-up here can only be the release's notification.
    const wake = createClaimWake({ listen: jobs.listenForWork, fallbackMs: 10 * 60_000 })
    const undici = createUndiciForward()
    const app = createApp({ config: testConfig([route('http://127.0.0.1:9')], { job_types: jobTypes }), store: t.store, forward: undici.forward, jobs, claimWake: wake })
    try {
      const { json: job } = await start('k1')
      const { json: c } = await claim('w1')
      const waiting = app.request('/_fencegate/jobs/claim', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ worker_id: 'w2', wait: 25 }) })
      while (!(wake.stats().waiting === 1 && wake.stats().listening)) await new Promise((r) => setTimeout(r, 5))
      expect((await call(`/${job.job_id}/release`, { worker_id: 'w1', fence: c.fence })).status).toBe(200)
      const got = await waiting
      expect([got.status, await got.json()]).toMatchObject([200, { job_id: job.job_id, fence: '2', attempt: 1 }])
      expect(wake.stats()).toMatchObject({ notified: 1, ticks: 0 })
    } finally {
      await wake.close()
      await undici.close()
    }
  })

  it('delivers a cancel through the heartbeat and refuses completion after it; cancels repeat harmlessly', async () => {
    const { json: running } = await start('k1')
    const { json: c } = await claim('w1')
    expect((await call(`/${running.job_id}/cancel`)).status).toBe(200)
    expect((await call(`/${running.job_id}/cancel`)).status).toBe(200)
    expect((await call(`/${running.job_id}/heartbeat`, { worker_id: 'w1', fence: c.fence })).json.cancel_requested).toBe(true)
    expect((await call(`/${running.job_id}/complete`, { worker_id: 'w1', fence: c.fence, result: 1 })).json.code).toBe('not_owner')
    expect((await call(`/${running.job_id}/fail`, { worker_id: 'w1', fence: c.fence, retryable: true })).json.state).toBe('cancelled')
    const { json: queued } = await start('k2')
    expect((await call(`/${queued.job_id}/cancel`)).json.state).toBe('cancelled')
    expect((await claim('w2')).status).toBe(204)
  })

  it('finishes a job out of attempts as failed without blocking the queue behind it', async () => {
    const { json: doomed } = await start('k1')
    for (let i = 0; i < 3; i++) {
      expect((await claim('w')).json.job_id).toBe(doomed.job_id)
      await expire(doomed.job_id)
    }
    const { json: next } = await start('k2')
    expect((await claim('w')).json.job_id).toBe(next.job_id)
    expect((await call(`/${doomed.job_id}`, undefined, 'GET')).json).toMatchObject({ state: 'failed', error_code: 'max_attempts', attempt: 3 })
  })

  it('reclaims every expired lease, however many there are', async () => {
    const ids: string[] = []
    for (let i = 0; i < 120; i++) ids.push((await start(`bulk-${i}`)).json.job_id)
    for (let i = 0; i < 120; i++) expect((await claim('first')).status).toBe(200)
    await t.db.sql`UPDATE fg_jobs SET lease_until = now() - interval '1 second'`
    const reclaimed = new Set<string>()
    for (let i = 0; i < 120; i++) reclaimed.add((await claim('second')).json.job_id)
    expect([...reclaimed].sort()).toEqual([...ids].sort())
    expect((await claim('second')).status).toBe(204)
  })

  it('appends output in sequence: retries are no-ops, gaps and rewrites conflict', async () => {
    const { json: job } = await start('k1')
    const { json: c } = await claim('w1')
    const h = { worker_id: 'w1', fence: c.fence }
    expect((await call(`/${job.job_id}/append`, { ...h, seq: 0, chunk: 'a' })).json.cursor_length).toBe(1)
    expect((await call(`/${job.job_id}/append`, { ...h, seq: 0, chunk: 'a' })).status).toBe(200)
    expect((await call(`/${job.job_id}/append`, { ...h, seq: 0, chunk: 'b' })).json.code).toBe('sequence_conflict')
    expect((await call(`/${job.job_id}/append`, { ...h, seq: 2, chunk: 'c' })).json.code).toBe('sequence_conflict')
    expect((await call(`/${job.job_id}/append`, { ...h, seq: 1, chunk: { row: 2 } })).json.cursor_length).toBe(2)
    const read = await call(`/${job.job_id}?from=1`, undefined, 'GET')
    expect([read.json.cursor_length, read.json.chunks]).toEqual([2, [{ row: 2 }]])
    await expire(job.job_id)
    expect((await call(`/${job.job_id}/append`, { ...h, seq: 2, chunk: 'late' })).json.code).toBe('lease_lost')
  })

  it('fails a job renewed past max_runtime', async () => {
    const { json: job } = await start('k1')
    const { json: c } = await claim('w1')
    await t.db.sql`UPDATE fg_jobs SET started_at = now() - interval '31 minutes' WHERE id = ${job.job_id}::bigint`
    const hb = await call(`/${job.job_id}/heartbeat`, { worker_id: 'w1', fence: c.fence })
    expect([hb.status, hb.json.reason]).toEqual([409, 'max_runtime'])
    expect((await call(`/${job.job_id}`, undefined, 'GET')).json).toMatchObject({ state: 'failed', error_code: 'max_runtime' })
  })

  it('regressions: restart clears output, a pending cancel is the reason, bad text is a 400, no audit for a missing job', async () => {
    const { json: job } = await start('k1')
    const { json: c } = await claim('w1')
    await call(`/${job.job_id}/append`, { worker_id: 'w1', fence: c.fence, seq: 0, chunk: 'old' })
    await call(`/${job.job_id}/fail`, { worker_id: 'w1', fence: c.fence, retryable: false })
    await start('k1', { restart: true })
    const { json: again } = await claim('w2')
    expect((await call(`/${job.job_id}`, undefined, 'GET')).json.cursor_length).toBe(0)
    expect((await call(`/${job.job_id}/append`, { worker_id: 'w2', fence: again.fence, seq: 0, chunk: 'new' })).status).toBe(200)
    await call(`/${job.job_id}/cancel`)
    expect((await call(`/${job.job_id}/append`, { worker_id: 'w2', fence: again.fence, seq: 1, chunk: 'x' })).json.reason).toBe('cancelled')
    expect((await call('', { type: 'report', key: 'a\u0000b' })).json.code).toBe('invalid_request')
    expect((await call('', { type: 'report', key: 'k9', payload: { s: '\u0000' } })).json.code).toBe('invalid_request')
    expect((await call('/777777/complete', { worker_id: 'w', fence: '1', result: 1 })).json.code).toBe('job_not_found')
    expect(await t.store.listAudit({ limit: 10, code: 'result_rejected' })).toEqual([])
  })

  it('a fence: lease route forwards only the current token of a live lease', async () => {
    const upstream = await startUpstream()
    const leaseGw = await startTestGateway({
      config: testConfig([route(upstream.url, { name: 'render', path: '/reports/:id', fence: 'lease', entity: 'job:{header.X-Job-Id}' })], { job_types: jobTypes }),
      store: t.store,
      jobs: createJobStore(t.db),
    })
    try {
      const { json: job } = await start('k1')
      const { json: c } = await claim('w1')
      const send = (fence: string, jobId = job.job_id) => post(`${leaseGw.url}/reports/1`, fence, { headers: { 'x-job-id': jobId } })
      expect((await send(c.fence)).status).toBe(200)
      expect((await send('7')).json.code).toBe('lease_expired')
      expect((await send(c.fence, 'not-a-job')).json.code).toBe('lease_expired')
      expect((await post(`${leaseGw.url}/reports/1`, c.fence)).json.code).toBe('entity_unresolved')
      await expire(job.job_id)
      // Expired: refused before anyone else claims the job.
      const late = await send(c.fence)
      expect([late.status, late.json.code]).toEqual([409, 'lease_expired'])
      const { json: next } = await claim('w2')
      expect((await send(c.fence)).json.code).toBe('lease_expired')
      expect((await send(next.fence)).status).toBe(200)
      expect(upstream.received.map((r) => r.headers['x-execution-fence'])).toEqual(['1', '2'])
      expect(await t.store.listAudit({ limit: 10, code: 'lease_expired' })).toHaveLength(4)
    } finally {
      await leaseGw.close()
      await upstream.close()
    }
  })

  it('20 workers over 500 jobs: every job completes exactly once and none ever has two live owners', async () => {
    const ids = new Set<string>()
    for (let i = 0; i < 500; i++) ids.add((await start(`many-${i}`)).json.job_id)
    const claims = new Map<string, string[]>()
    const completions = new Map<string, number>()
    await Promise.all(Array.from({ length: 20 }, async (_, w) => {
      for (let i = 0; i < 1000; i++) {
        const got = await claim(`w${w}`)
        if (got.status === 204) return
        claims.set(got.json.job_id, [...(claims.get(got.json.job_id) ?? []), `w${w}`])
        const done = await call(`/${got.json.job_id}/complete`, { worker_id: `w${w}`, fence: got.json.fence, result: w })
        if (done.status === 200) completions.set(got.json.job_id, (completions.get(got.json.job_id) ?? 0) + 1)
      }
    }))
    expect(new Set(claims.keys())).toEqual(ids)
    for (const [, owners] of claims) expect(owners).toHaveLength(1)
    for (const id of ids) expect(completions.get(id)).toBe(1)
  })
})

const postgresBackend = backends().find((b) => b.name === 'postgres')

describe.skipIf(!postgresBackend)('claims racing a renewal, on PostgreSQL', () => {
  it('a renewal that holds the row while a claim scans keeps the job', async () => {
    const t = await postgresBackend!.open()
    const jobs = createJobStore(t.db)
    const types = testConfig([route('http://127.0.0.1:9')], { job_types: jobTypes }).job_types
    try {
      const { job_id } = await jobs.startJob({ tenant: 'default', type: 'report', key: 'race', payload: null, restart: false })
      const first = await jobs.claimOne({ tenant: 'default', workerId: 'w1', types })
      await t.db.sql`UPDATE fg_jobs SET lease_until = now() - interval '1 second' WHERE id = ${job_id}::bigint`
      // The owner's renewal is in flight (row locked, lease extended, not yet committed) while another worker claims.
      await t.db.begin(async (tx) => {
        await tx.sql`UPDATE fg_jobs SET lease_until = now() + interval '45 seconds' WHERE id = ${job_id}::bigint AND owner = 'w1' AND fence = ${first!.fence}::bigint`
        expect(await jobs.claimOne({ tenant: 'default', workerId: 'w2', types })).toBeUndefined()
      })
      expect(await jobs.claimOne({ tenant: 'default', workerId: 'w2', types })).toBeUndefined()
      expect(await jobs.getJob('default', job_id)).toMatchObject({ owner: 'w1', fence: '1', state: 'running' })
    } finally {
      await t.close()
    }
  })
})
