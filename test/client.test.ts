import { execFile } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { main as reportWorker } from '../examples/report-worker.js'
import { FencegateClient, JobCancelled, LeaseLost, OwnershipUnknown, type FetchLike, type Lease, type WorkEvent } from '../src/client/index.js'
import { createJobStore } from '../src/leases/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'
import { supersede } from './helpers/successor.js'

const jobTypes = [
  { name: 'report', lease: '3s', max_attempts: 5, backoff: '1s' },
  { name: 'quick', lease: '2s', max_attempts: 5, backoff: '1s' },
]

/** The real fetch, recording every call and able to fail or hold heartbeats: a flaky or hung store, seen from the worker. */
function recordingFetch() {
  const calls: string[] = []
  const answered: string[] = []
  const faults = { failHeartbeats: 0, holdHeartbeats: false, slowClaimMs: 0 }
  const fetchImpl: FetchLike = async (input, init) => {
    const path = new URL(String(input)).pathname
    calls.push(`${init?.method ?? 'GET'} ${path}`)
    // A slow network on the way in: the claim reaches the gateway this long after the SDK sent it.
    if (path.endsWith('/claim') && faults.slowClaimMs) await new Promise((r) => setTimeout(r, faults.slowClaimMs))
    if (path.endsWith('/heartbeat')) {
      if (faults.failHeartbeats > 0) {
        faults.failHeartbeats--
        throw new TypeError('fetch failed (injected)')
      }
      if (faults.holdHeartbeats) {
        return new Promise((_, reject) => init!.signal!.addEventListener('abort', () => reject(init!.signal!.reason)))
      }
    }
    const answer = await fetch(input, init)
    answered.push(`${init?.method ?? 'GET'} ${path}`)
    return answer
  }
  return { calls, answered, faults, fetch: fetchImpl, sent: (suffix: string) => calls.filter((c) => c.endsWith(suffix)).length }
}

/** Polls until `check` holds: on database state or on the lease, never on elapsed time. */
async function until(check: () => boolean | Promise<boolean>): Promise<void> {
  while (!(await check())) await new Promise((r) => setTimeout(r, 20))
}

async function statesUntilLost(lease: Lease): Promise<string[]> {
  const seen: string[] = []
  while (seen.at(-1) !== 'lost') seen.push(await lease.changed())
  return seen
}

describe.each(backends())('worker SDK on $name', (backend) => {
  let t: TestDb
  let gw: TestGateway
  let upstream: TestUpstream
  let rec: ReturnType<typeof recordingFetch>
  let client: FencegateClient

  beforeEach(async () => {
    t = await backend.open()
    upstream = await startUpstream((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ path: req.path, fence: req.headers['x-execution-fence'] }))
    })
    const step = route(upstream.url, { name: 'step', path: '/steps/:step', entity: 'job:{header.X-Job-Id}', fence: 'lease', idempotency: 'required' })
    gw = await startTestGateway({ config: testConfig([step], { job_types: jobTypes }), store: t.store, jobs: createJobStore(t.db) })
    rec = recordingFetch()
    client = new FencegateClient({ baseUrl: gw.url, fetch: rec.fetch })
  })
  afterEach(async () => {
    await gw.close()
    await upstream.close()
    await t.close()
  })

  const dbSays = async (jobId: string, condition: 'expired' | 'past_three_leases') => {
    const [row] = await t.db.sql<{ yes: boolean }>`
      SELECT CASE WHEN ${condition} = 'expired' THEN lease_until <= now() ELSE now() > started_at + interval '5 seconds' END AS yes
      FROM fg_jobs WHERE id = ${jobId}::bigint`
    return row!.yes
  }
  const received = (step: string) => upstream.received.filter((r) => r.path === `/steps/${step}`)
  const stepCall = (lease: Lease, step: string) => lease.step(step, () => lease.fetch(`${gw.url}/steps/${step}`, { method: 'POST', body: '{}' }))

  it('owner: renews on its own timer past several leases, fences every step and completes under the lease', async () => {
    const { job_id } = await client.start({ type: 'quick', key: 'k1', payload: { account: 'acme' } })
    const events: WorkEvent[] = []
    const stop = new AbortController()
    let renewals = 0
    await client.work({ types: ['quick'], signal: stop.signal, claimWait: 1, onEvent: (e) => {
      events.push(e)
      if (e.type === 'completed') stop.abort()
    } }, async (job, lease) => {
      // Hold the job for two and a half leases of 2 s, by the database clock.
      await until(() => dbSays(job.id, 'past_three_leases'))
      expect(lease.ownership).toBe('owner')
      const res = await stepCall(lease, 'render')
      expect(res.status).toBe(200)
      await lease.append({ rendered: true })
      renewals = lease.renewals
      return { account: (job.payload as { account: string }).account }
    })
    expect(events.map((e) => e.type)).toEqual(['claimed', 'completed'])
    expect(renewals).toBeGreaterThanOrEqual(3)
    expect(received('render')).toHaveLength(1)
    expect(received('render')[0]!.headers).toMatchObject({ 'x-execution-fence': '1', 'x-job-id': job_id, 'idempotency-key': `fg.${job_id}.render` })
    expect(await client.getJob(job_id, 0)).toMatchObject({ state: 'succeeded', result: { account: 'acme' }, chunks: [{ rendered: true }] })
  })

  it('ownership unknown: after a failed renewal no step starts until a renewal is confirmed', async () => {
    const { job_id } = await client.start({ type: 'report', key: 'k1' })
    const { lease } = (await client.claim({ types: ['report'], workerId: 'w1' }))!
    rec.faults.failHeartbeats = 1
    expect(await lease.changed()).toBe('unknown')
    let ranA = false
    await expect(lease.step('a', () => (ranA = true), { ifUnknown: 'throw' })).rejects.toBeInstanceOf(OwnershipUnknown)
    let stateWhenBRan = ''
    const b = lease.step('b', () => {
      stateWhenBRan = lease.ownership
      return lease.fetch(`${gw.url}/steps/b`, { method: 'POST', body: '{}' })
    })
    expect((await b).status).toBe(200)
    expect([ranA, stateWhenBRan, received('a').length, received('b').length]).toEqual([false, 'owner', 0, 1])
    expect(lease.renewals).toBeGreaterThanOrEqual(1)
    await lease.complete({ ok: true })
    expect((await client.getJob(job_id)).state).toBe('succeeded')
  })

  it('a hung store cannot leave the worker unmonitored: held renewals time out, ownership goes unknown, then lost at the deadline', async () => {
    const { job_id } = await client.start({ type: 'quick', key: 'k1' })
    const { lease } = (await client.claim({ types: ['quick'], workerId: 'w1' }))!
    rec.faults.holdHeartbeats = true
    expect(await statesUntilLost(lease)).toEqual(['unknown', 'lost'])
    expect(lease.signal.reason).toBeInstanceOf(LeaseLost)
    expect((lease.signal.reason as LeaseLost).reason).toBe('deadline')
    await expect(stepCall(lease, 'render')).rejects.toBeInstanceOf(LeaseLost)
    await expect(lease.append({ late: true })).rejects.toBeInstanceOf(LeaseLost)
    await expect(lease.complete({ late: true })).rejects.toBeInstanceOf(LeaseLost)
    expect([rec.sent('/append'), rec.sent('/complete'), received('render').length]).toEqual([0, 0, 0])
    // The local deadline is never later than the database's: once the database agrees, a successor takes over cleanly.
    await until(() => dbSays(job_id, 'expired'))
    const next = (await new FencegateClient({ baseUrl: gw.url }).claim({ types: ['quick'], workerId: 'w2' }))!
    expect(next.job.fence).toBe('2')
    await next.lease.complete({ by: 'w2' })
  })

  it('lost: a 409 aborts the signal, and a handler that ignores it cannot commit', async () => {
    const { job_id } = await client.start({ type: 'report', key: 'k1' })
    const events: WorkEvent[] = []
    const stop = new AbortController()
    const attempts: string[] = []
    let handlerDone!: () => void
    const handlerFinished = new Promise<void>((r) => (handlerDone = r))
    const working = client.work({ types: ['report'], workerId: 'w1', signal: stop.signal, claimWait: 1, shutdownGraceMs: 100, onEvent: (e) => events.push(e) }, async (_job, lease) => {
      await stepCall(lease, 'fetch-data')
      // A successor takes the job: the lease is moved into the past on the database clock and reclaimed.
      expect((await supersede(t.db, gw.url, { jobId: job_id, type: 'report', workerId: 'w2' })).job.fence).toBe('2')
      // This handler ignores lease.signal; it only notices the loss by polling, then tries to write anyway.
      await until(() => lease.ownership === 'lost')
      for (const attempt of [() => stepCall(lease, 'render'), () => lease.append({ by: 'w1' })]) {
        await attempt().then(() => attempts.push('sent'), (err: unknown) => attempts.push(err instanceof LeaseLost ? err.reason : String(err)))
      }
      handlerDone()
      return { by: 'w1' }
    })
    await handlerFinished
    stop.abort()
    await working
    expect(attempts).toEqual(['superseded', 'superseded'])
    // Its slot drains while it polls on (draining, drained), unless it happened to settle within a turn of the loss;
    // test/client-draining.test.ts covers the slots.
    expect(events.map((e) => e.type).filter((type) => !['draining', 'drained', 'all_slots_draining'].includes(type))).toEqual(['claimed', 'lost'])
    expect([rec.sent('/append'), rec.sent('/complete'), received('render').length]).toEqual([0, 0, 0])
    // The server refuses a commit from the old fence anyway.
    const late = await fetch(`${gw.url}/_fencegate/jobs/${job_id}/complete`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ worker_id: 'w1', fence: '1', result: { by: 'w1' } }) })
    expect(late.status).toBe(409)
    expect(await client.getJob(job_id)).toMatchObject({ state: 'running', owner: 'w2', fence: '2', result: null })
  })

  it('cancel: a cancel delivered by a heartbeat aborts the signal and ends the job as cancelled, with nothing committed, before work() resolves', async () => {
    const { job_id } = await client.start({ type: 'report', key: 'k1' })
    const events: WorkEvent[] = []
    const stop = new AbortController()
    let reason: unknown
    await client.work({ types: ['report'], signal: stop.signal, claimWait: 1, onEvent: (e) => {
      events.push(e)
      if (e.type === 'claimed') void fetch(`${gw.url}/_fencegate/jobs/${job_id}/cancel`, { method: 'POST' })
      else stop.abort()
    } }, async (_job, lease) => {
      await new Promise((resolve) => lease.signal.addEventListener('abort', resolve, { once: true }))
      reason = lease.signal.reason
      return { ignored: true }
    })
    // work() resolved only once the fail that ends the job as cancelled was answered (CI once read the job as running).
    expect(rec.answered.filter((c) => c.endsWith('/fail'))).toHaveLength(1)
    expect(reason).toBeInstanceOf(JobCancelled)
    expect(events.map((e) => e.type)).toEqual(['claimed', 'cancelled'])
    expect(await client.getJob(job_id)).toMatchObject({ state: 'cancelled', result: null })
    expect(rec.sent('/complete')).toBe(0)
  })

  it('a CPU-bound handler that blocks the event loop longer than the lease loses it cleanly', async () => {
    const { job_id } = await client.start({ type: 'quick', key: 'k1' })
    const events: WorkEvent[] = []
    const stop = new AbortController()
    await client.work({ types: ['quick'], signal: stop.signal, claimWait: 1, onEvent: (e) => {
      events.push(e)
      if (e.type !== 'claimed') stop.abort()
    } }, (_job, lease) => {
      // Twice the 2 s lease of synchronous work: no timer, heartbeat or I/O runs meanwhile (the in-process gateway stalls too).
      const until = performance.now() + 4000
      while (performance.now() < until) Math.sqrt(Math.random())
      return { fence: lease.fence }
    })
    expect(events).toEqual([{ type: 'claimed', jobId: job_id, fence: '1' }, { type: 'lost', jobId: job_id, fence: '1', reason: 'deadline' }])
    expect(rec.sent('/complete')).toBe(0)
    await until(() => dbSays(job_id, 'expired'))
    expect((await client.claim({ types: ['quick'], workerId: 'w2' }))?.job.fence).toBe('2')
  })

  it('above one job at a time, claims in batches for the free slots, each job run and completed once under its own fence', async () => {
    const claims: { max: unknown; got: number }[] = []
    const batching = new FencegateClient({
      baseUrl: gw.url,
      fetch: async (input, init) => {
        const res = await fetch(input, init)
        if (!String(input).endsWith('/claim')) return res
        const text = await res.text()
        claims.push({ max: JSON.parse(String(init!.body)).max, got: text ? (JSON.parse(text).jobs?.length ?? 0) : 0 })
        return new Response(text || null, { status: res.status, headers: res.headers })
      },
    })
    const started = await Promise.all(Array.from({ length: 40 }, (_, i) => batching.start({ type: 'quick', key: `b${i}` })))
    const ran = new Map<string, number>()
    const stop = new AbortController()
    const working = batching.work({ types: ['quick'], concurrency: 4, signal: stop.signal, claimWait: 1 }, async (job) => {
      ran.set(job.id, (ran.get(job.id) ?? 0) + 1)
      return { fence: job.fence }
    })
    await until(async () => (await t.db.sql<{ n: number }>`SELECT count(*)::int AS n FROM fg_jobs WHERE state = 'succeeded'`)[0]!.n === 40)
    stop.abort()
    await working
    // The first claim asks for every slot and gets four jobs in one request.
    expect(claims[0]).toEqual({ max: 4, got: 4 })
    expect(claims.every((c) => typeof c.max === 'number' && c.max >= 1 && c.max <= 4)).toBe(true)
    expect([...ran.values()].every((n) => n === 1) && ran.size === 40).toBe(true)
    for (const s of started) expect(await batching.getJob(s.job_id)).toMatchObject({ state: 'succeeded', attempt: 1, fence: '1', result: { fence: '1' } })
  })

  it('graceful shutdown: stops claiming, lets in-flight jobs finish and releases the ones that do not', async () => {
    const polite = await client.start({ type: 'report', key: 'polite', payload: { polite: true } })
    const stubborn = await client.start({ type: 'report', key: 'stubborn', payload: { polite: false } })
    const events: WorkEvent[] = []
    const stop = new AbortController()
    let release!: () => void
    const never = new Promise<void>((r) => (release = r))
    const working = client.work({ types: ['report'], concurrency: 2, signal: stop.signal, claimWait: 1, shutdownGraceMs: 300, onEvent: (e) => events.push(e) },
      async (job) => {
        if ((job.payload as { polite: boolean }).polite) {
          await until(() => stop.signal.aborted)
          return { finished: 'in grace' }
        }
        await never
        return { finished: 'too late' }
      })
    await until(() => events.filter((e) => e.type === 'claimed').length === 2)
    stop.abort()
    const claimsAtShutdown = rec.sent('/claim')
    const late = await client.start({ type: 'report', key: 'late' })
    // The stubborn handler never settled: work() resolves at the end of the grace period and names it.
    expect(await working).toEqual({ unsettled: [stubborn.job_id] })
    release()
    expect(rec.sent('/claim')).toBe(claimsAtShutdown)
    expect(events.filter((e) => e.type !== 'claimed').map((e) => [e.type, e.jobId]).sort()).toEqual([['completed', polite.job_id], ['released', stubborn.job_id]].sort())
    expect(await client.getJob(polite.job_id)).toMatchObject({ state: 'succeeded', result: { finished: 'in grace' } })
    // Released, not failed: the attempt is given back, nothing is recorded as an error, and no backoff applies.
    expect(rec.sent('/release')).toBe(1)
    expect(rec.sent('/fail')).toBe(0)
    expect(await client.getJob(stubborn.job_id)).toMatchObject({ state: 'queued', attempt: 0, fence: '1', error: null })
    expect(await client.getJob(late.job_id)).toMatchObject({ state: 'queued', attempt: 0 })
    const [due] = await t.db.sql<{ due: boolean }>`SELECT run_after <= now() AS due FROM fg_jobs WHERE id = ${stubborn.job_id}::bigint`
    expect(due!.due).toBe(true)
  })

  it('takes the lease from the claim answer alone (no read follows a claim) and counts it from the send, so a slow claim only shortens it', async () => {
    const { job_id } = await client.start({ type: 'report', key: 'k1' })
    const { lease } = (await client.claim({ types: ['report'], workerId: 'w1' }))!
    expect(rec.calls).toEqual(['POST /_fencegate/jobs', 'POST /_fencegate/jobs/claim'])
    expect([lease.jobId, lease.fence, lease.cursor, lease.ownership]).toEqual([job_id, '1', 0, 'owner'])
    await lease.append({ part: 1 })
    await lease.release()
    // The successor learns where the output stands from its claim, too.
    const next = (await client.claim({ types: ['report'], workerId: 'w2' }))!
    expect([next.job.id, next.job.fence, next.job.attempt, next.lease.cursor]).toEqual([job_id, '2', 1, 1])
    expect(rec.calls.filter((c) => c.startsWith('GET'))).toEqual([])
    await next.lease.complete({ ok: true })
    // The lease starts a second after the send; the local deadline (no renewal gets through) still counts from the send,
    // so the worker stops while the database still holds the lease, not a second after it expired.
    const { job_id: slowJob } = await client.start({ type: 'quick', key: 'slow' })
    Object.assign(rec.faults, { slowClaimMs: 1000, holdHeartbeats: true })
    const slow = (await client.claim({ types: ['quick'], workerId: 'w3' }))!
    await statesUntilLost(slow.lease)
    expect(await dbSays(slowJob, 'expired')).toBe(false)
    expect((slow.lease.signal.reason as LeaseLost).reason).toBe('deadline')
  })
})

describe.each(backends())('examples/report-worker.ts on $name', (backend) => {
  it('runs the documented example end to end: each report fetched, scored in a thread, published once', async () => {
    const t = await backend.open()
    const upstream = await startUpstream((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(req.path.startsWith('/crm/') ? JSON.stringify({ usage: [3, 5, 8] }) : JSON.stringify({ published: true }))
    })
    const lease = { fence: 'lease', entity: 'job:{header.X-Job-Id}', idempotency: 'required' }
    const config = testConfig([
      route(upstream.url, { ...lease, name: 'crm-usage', path: '/crm/accounts/:account/usage' }),
      route(upstream.url, { ...lease, name: 'publish-report', path: '/reports/:account' }),
    ], { job_types: [{ name: 'customer_health_report', lease: '5s' }] })
    const gw = await startTestGateway({ config, store: t.store, jobs: createJobStore(t.db) })
    try {
      const client = new FencegateClient({ baseUrl: gw.url })
      const jobs = await Promise.all(['acme', 'globex'].map((account) => client.start({ type: 'customer_health_report', key: `${account}:2026-08`, payload: { account } })))
      const stop = new AbortController()
      const events: WorkEvent[] = []
      await reportWorker({ baseUrl: gw.url, signal: stop.signal, concurrency: 2, onEvent: (e) => {
        events.push(e)
        if (events.filter((x) => x.type === 'completed').length === 2) stop.abort()
      } })
      expect(events.filter((e) => e.type !== 'claimed').map((e) => e.type)).toEqual(['completed', 'completed'])
      for (const { job_id } of jobs) {
        const job = await client.getJob(job_id, 0)
        expect(job).toMatchObject({ state: 'succeeded', result: { score: expect.any(Number) } })
        expect(job.chunks).toEqual([{ step: 'scored', score: (job.result as { score: number }).score }])
      }
      expect(upstream.received.map((r) => r.path).sort()).toEqual(['/crm/accounts/acme/usage', '/crm/accounts/globex/usage', '/reports/acme', '/reports/globex'])
    } finally {
      await gw.close()
      await upstream.close()
      await t.close()
    }
  })
})

describe('fencegate/client', () => {
  it('imports nothing from node:, so it runs in any fetch-capable runtime', () => {
    const dir = join(import.meta.dirname, '../src/client')
    for (const file of readdirSync(dir)) expect(readFileSync(join(dir, file), 'utf8')).not.toMatch(/from ['"]node:/)
  })

  it('is exported as fencegate/client from the built package', async () => {
    const script = "const m = await import('fencegate/client'); console.log(Object.keys(m).sort().join(','))"
    const out = await new Promise<string>((resolve, reject) => execFile(process.execPath, ['--input-type=module', '-e', script], { cwd: join(import.meta.dirname, '..') },
      (err, stdout) => (err ? reject(err) : resolve(stdout.trim()))))
    expect(out.split(',')).toEqual(expect.arrayContaining(['FencegateClient', 'LeaseLost', 'OwnershipUnknown', 'JobCancelled', 'PermanentFailure', 'Lease']))
  })
})
