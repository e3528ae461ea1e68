/**
 * Claim long-poll: a waiting claim is woken by LISTEN/NOTIFY when a job becomes
 * claimable, and by a bounded fallback tick for what sends no notification (an expired
 * lease, a dropped LISTEN connection). Each test injects the wake with its own fallback
 * interval: ten minutes where a wake-up must be the notification's, since no test here
 * runs that long, and a short one where the tick itself is under test.
 */
import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import postgres from 'postgres'
import { afterEach, describe, expect, it } from 'vitest'
import { createDataPlane } from '../src/gateway/app.js'
import { createJobStore, type JobStore } from '../src/leases/store.js'
import { createClaimWake, defaultFallbackMs, type ClaimWake } from '../src/leases/wake.js'
import { dataPlaneListener, listen } from '../src/runtime/node/gateway.js'
import { createUndiciForward } from '../src/runtime/node/forward.js'
import { silentLogger } from '../src/observe/log.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, testConfig } from './helpers/gateway.js'

const jobTypes = [
  { name: 'report', lease: '45s', max_attempts: 3, backoff: '0s' },
  { name: 'other', lease: '45s' },
]
/** Longer than any test here may take: a wake-up within a test is never this tick. */
const notificationOnly = 10 * 60_000

interface Served {
  url: string
  wake: ClaimWake
  jobs: JobStore
  close(): Promise<void>
}

/** The real data app over loopback HTTP, with the claim wake injected. */
async function serve(t: TestDb, fallbackMs: number): Promise<Served> {
  const config = testConfig([route('http://127.0.0.1:9')], { job_types: jobTypes })
  const jobs = createJobStore(t.db)
  const wake = createClaimWake({ listen: jobs.listenForWork, fallbackMs })
  const undici = createUndiciForward()
  // Served as `fencegate serve` serves it: Node's data plane, straight off the socket.
  const plane = createDataPlane({ config, store: t.store, forward: undici.forward, jobs, claimWake: wake })
  const server: Server = await listen(dataPlaneListener(plane, silentLogger), '127.0.0.1', 0, config.server)
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/_fencegate/jobs`,
    wake,
    jobs,
    async close() {
      await new Promise<void>((resolve) => {
        server.close(() => resolve())
        if ('closeAllConnections' in server) server.closeAllConnections()
      })
      await wake.close()
      await undici.close()
    },
  }
}

async function call(url: string, body?: unknown, init: { method?: string; signal?: AbortSignal } = {}) {
  const res = await fetch(url, {
    method: init.method ?? 'POST', headers: { 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }), ...(init.signal ? { signal: init.signal } : {}),
  })
  const text = await res.text()
  return { status: res.status, json: text ? JSON.parse(text) : undefined }
}

/** Polls a condition on state (the wake's counters or the database), never a fixed sleep. */
async function until(what: string, check: () => boolean | Promise<boolean>, limitMs = 15_000): Promise<void> {
  const giveUp = performance.now() + limitMs
  while (!(await check())) {
    if (performance.now() > giveUp) throw new Error(`timed out waiting until ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
}

const waitingIs = (s: Served, n: number) => until(`${n} claim(s) wait`, () => s.wake.stats().waiting === n && s.wake.stats().listening)

describe.each(backends())('claim wait on $name', (backend) => {
  let t: TestDb
  let s: Served | undefined
  afterEach(async () => {
    await s?.close()
    s = undefined
    await t.close()
  })
  const open = async (fallbackMs: number) => {
    t = await backend.open()
    s = await serve(t, fallbackMs)
    return s
  }
  const start = (gw: Served, key: string, type = 'report', extra: Record<string, unknown> = {}) => call(gw.url, { type, key, payload: { key }, ...extra })
  const claim = (gw: Served, worker: string, extra: Record<string, unknown> = {}, signal?: AbortSignal) =>
    call(`${gw.url}/claim`, { worker_id: worker, ...extra }, signal ? { signal } : {})

  it('a waiting claim gets a job started after it began waiting, woken by the notification', async () => {
    const gw = await open(notificationOnly)
    const waiting = claim(gw, 'w1', { wait: 25 })
    await waitingIs(gw, 1)
    const { json: job } = await start(gw, 'k1')
    const got = await waiting
    expect([got.status, got.json.job_id, got.json.type, got.json.fence]).toEqual([200, job.job_id, 'report', '1'])
    expect(gw.wake.stats()).toMatchObject({ notified: 1, ticks: 0, waiting: 0, registered: 0 })
  })

  it('a retryable fail and a restart wake a waiting claim too', async () => {
    const gw = await open(notificationOnly)
    const { json: job } = await start(gw, 'k1')
    const first = await claim(gw, 'w1')
    // Back to queued (backoff 0s): the fail statement notifies.
    const retrying = claim(gw, 'w2', { wait: 25 })
    await waitingIs(gw, 1)
    expect((await call(`${gw.url}/${job.job_id}/fail`, { worker_id: 'w1', fence: first.json.fence, retryable: true })).json.state).toBe('queued')
    const second = await retrying
    expect([second.status, second.json.job_id, second.json.fence]).toEqual([200, job.job_id, '2'])
    // Failed for good, then restarted: the start statement notifies.
    expect((await call(`${gw.url}/${job.job_id}/fail`, { worker_id: 'w2', fence: '2', retryable: false })).json.state).toBe('failed')
    const restarted = claim(gw, 'w3', { wait: 25 })
    await waitingIs(gw, 1)
    expect((await start(gw, 'k1', 'report', { restart: true })).status).toBe(200)
    const third = await restarted
    expect([third.status, third.json.job_id, third.json.fence]).toEqual([200, job.job_id, '3'])
    expect(gw.wake.stats()).toMatchObject({ notified: 2, ticks: 0 })
  })

  it('a notification for one type does not wake the waiters of another', async () => {
    const gw = await open(notificationOnly)
    const others = claim(gw, 'w-other', { types: ['other'], wait: 2 })
    const reports = claim(gw, 'w-report', { types: ['report'], wait: 25 })
    await waitingIs(gw, 2)
    const { json: job } = await start(gw, 'k1', 'report')
    const got = await reports
    expect([got.status, got.json.job_id, got.json.type]).toEqual([200, job.job_id, 'report'])
    // Only the report waiter was woken; the other one waits out its deadline.
    expect(gw.wake.stats()).toMatchObject({ notified: 1, waiting: 1 })
    expect((await others).status).toBe(204)
    const view = await call(`${gw.url}/${job.job_id}`, undefined, { method: 'GET' })
    expect(view.json).toMatchObject({ owner: 'w-report', fence: '1', attempt: 1 })
  })

  it('many waiters, one job: exactly one claims it, the others wait on and answer 204 at their deadline', async () => {
    const gw = await open(notificationOnly)
    const waiters = 8
    const answers = Array.from({ length: waiters }, (_, i) => {
      const answer = claim(gw, `w${i}`, { wait: 4 })
      const state = { settled: false, answer }
      void answer.then(() => (state.settled = true))
      return state
    })
    await waitingIs(gw, waiters)
    const { json: job } = await start(gw, 'k1')
    // Every waiter of the type was woken; one claim wins and the rest go back to waiting.
    await until('one claim answered', () => answers.some((a) => a.settled))
    await waitingIs(gw, waiters - 1)
    expect(answers.filter((a) => a.settled)).toHaveLength(1)
    const all = await Promise.all(answers.map((a) => a.answer))
    expect(all.filter((a) => a.status === 200).map((a) => a.json.job_id)).toEqual([job.job_id])
    expect(all.filter((a) => a.status === 204)).toHaveLength(waiters - 1)
    expect(gw.wake.stats()).toMatchObject({ notified: waiters, ticks: 0, registered: 0 })
  })

  it('a waiting claim fails closed when the store is down, before or during the wait', async () => {
    const gw = await open(notificationOnly)
    const during = claim(gw, 'w1', { wait: 1 })
    await waitingIs(gw, 1)
    await t.breakStore()
    // Nothing wakes it but its deadline; the claim it makes then cannot reach the store.
    expect((await during).json).toMatchObject({ status: 503, code: 'store_unavailable' })
    expect((await claim(gw, 'w2', { wait: 1 })).json).toMatchObject({ status: 503, code: 'store_unavailable' })
    // A process whose first waiting claim finds the store down: its LISTEN fails too, and the claim still answers 503.
    const fresh = await serve(t, notificationOnly)
    try {
      expect((await claim(fresh, 'w3', { wait: 1 })).json).toMatchObject({ status: 503, code: 'store_unavailable' })
      expect(fresh.wake.stats().listening).toBe(false)
    } finally {
      await fresh.close()
    }
  })

  it('a client that disconnects releases its waiter and is handed no job', async () => {
    const gw = await open(notificationOnly)
    const controller = new AbortController()
    const gone = claim(gw, 'w1', { wait: 25 }, controller.signal).catch((err: unknown) => err)
    await waitingIs(gw, 1)
    controller.abort()
    expect(await gone).toBeInstanceOf(Error)
    await until('the waiter is released', () => gw.wake.stats().registered === 0)
    const { json: job } = await start(gw, 'k1')
    const view = await call(`${gw.url}/${job.job_id}`, undefined, { method: 'GET' })
    expect(view.json).toMatchObject({ state: 'queued', attempt: 0, owner: null })
  })

  it('the fallback tick finds a job whose lease expired, which sends no notification', async () => {
    const gw = await open(50)
    const { json: job } = await start(gw, 'k1')
    expect((await claim(gw, 'w1')).json.fence).toBe('1')
    const waiting = claim(gw, 'w2', { wait: 25 })
    await until('the waiter has ticked once', () => gw.wake.stats().ticks >= 1)
    await t.db.sql`UPDATE fg_jobs SET lease_until = now() - interval '1 second' WHERE id = ${job.job_id}::bigint`
    const got = await waiting
    expect([got.status, got.json.job_id, got.json.fence, got.json.attempt]).toEqual([200, job.job_id, '2', 2])
    expect(gw.wake.stats().notified).toBe(0)
  })

  it.runIf(backend.name === 'postgres')('the LISTEN connection is re-established after pg_terminate_backend; waiters are served meanwhile and after', async () => {
    const gw = await open(notificationOnly)
    const admin = postgres(t.url!, { max: 1, onnotice: () => {} })
    try {
      const listeners = () => admin<{ pid: number; state: string }[]>`
        SELECT pid, state FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'listen %'`
      const first = claim(gw, 'w1', { wait: 25 })
      await waitingIs(gw, 1)
      const [before] = await listeners()
      expect(before).toBeDefined()
      const killed = await admin`SELECT pg_terminate_backend(${before!.pid})`
      expect(killed).toHaveLength(1)
      // Started while the LISTEN may still be down: its notification can be lost, and the
      // re-listen wakes every waiter to look again.
      const a = await gw.jobs.startJob({ tenant: 'default', type: 'report', key: 'k1', payload: null, restart: false })
      const got = await first
      expect([got.status, got.json.job_id]).toEqual([200, a.job_id])
      await until('postgres.js listens again', async () => (await listeners()).some((l) => l.pid !== before!.pid && l.state === 'idle'))
      await until('the wake saw the re-listen', () => gw.wake.stats().reconnects === 1)
      // After the reconnect, notifications wake waiters again (the tick is ten minutes).
      const second = claim(gw, 'w2', { wait: 25 })
      await waitingIs(gw, 1)
      const notifiedBefore = gw.wake.stats().notified
      const { json: b } = await start(gw, 'k2')
      const got2 = await second
      expect([got2.status, got2.json.job_id]).toEqual([200, b.job_id])
      expect(gw.wake.stats()).toMatchObject({ notified: notifiedBefore + 1, ticks: 0 })
    } finally {
      await admin.end()
    }
  })
})

describe('the claim wake on its own', () => {
  const deferred = () => {
    let resolve!: (u: () => Promise<void>) => void
    const promise = new Promise<() => Promise<void>>((r) => (resolve = r))
    return { promise, resolve }
  }

  it('keeps a notification that lands while the claim runs for its next wait, and wakes only waiters of that type', async () => {
    let notify!: (type: string) => void
    const wake = createClaimWake({ listen: async (onType) => ((notify = onType), async () => {}), fallbackMs: notificationOnly })
    const report = await wake.register(['report'], performance.now() + 60_000, 'acme')
    const other = await wake.register(['other'], performance.now() + 60_000, 'acme')
    notify('report:acme')
    const never = new AbortController()
    expect(await report.next(performance.now() + 60_000, never.signal)).toBe('notified')
    const aborted = new AbortController()
    const otherNext = other.next(performance.now() + 60_000, aborted.signal)
    expect(wake.stats().waiting).toBe(1)
    aborted.abort()
    expect(await otherNext).toBe('aborted')
    report.release()
    other.release()
    expect(wake.stats()).toMatchObject({ registered: 0, waiting: 0, notified: 0 })
  })

  it('wakes only the waiters of the notified tenant (a start in one tenant woke every tenant\'s waiters)', async () => {
    let notify!: (payload: string) => void
    const wake = createClaimWake({ listen: async (onType) => ((notify = onType), async () => {}), fallbackMs: notificationOnly })
    const acme = await wake.register(['report'], performance.now() + 60_000, 'acme')
    notify('report:globex')
    const never = new AbortController()
    expect(await acme.next(performance.now() + 50, never.signal)).toBe('deadline')
    notify('report:acme')
    expect(await acme.next(performance.now() + 60_000, never.signal)).toBe('notified')
    acme.release()
  })

  it('the first waiter waits for the LISTEN, but never past its own deadline', async () => {
    const slow = deferred()
    const wake = createClaimWake({ listen: () => slow.promise, fallbackMs: notificationOnly })
    let registered = false
    const first = wake.register(['report'], performance.now() + 60_000, 'acme').then((w) => ((registered = true), w))
    await until('the LISTEN was asked for', () => wake.stats().registered === 1)
    expect(registered).toBe(false)
    // A second waiter with a short deadline does not wait for the LISTEN past it.
    const second = await wake.register(['report'], performance.now() + 20, 'acme')
    expect(wake.stats().listening).toBe(false)
    slow.resolve(async () => {})
    const w = await first
    expect(wake.stats().listening).toBe(true)
    w.release()
    second.release()
  })

  it('without a LISTEN (or after it failed) waiters poll on the tick, and the LISTEN is retried at most once per tick', async () => {
    expect(defaultFallbackMs).toBe(1000)
    const polling = createClaimWake({ fallbackMs: 10 })
    const p = await polling.register(['report'], performance.now() + 60_000, 'acme')
    expect(await p.next(performance.now() + 60_000, new AbortController().signal)).toBe('tick')
    expect(polling.stats()).toMatchObject({ listening: false, ticks: 1 })
    p.release()

    let attempts = 0
    const failing = createClaimWake({ listen: async () => { attempts++; throw new Error('store down') }, fallbackMs: notificationOnly })
    const a = await failing.register(['report'], performance.now() + 60_000, 'acme')
    const b = await failing.register(['report'], performance.now() + 60_000, 'acme')
    expect(attempts).toBe(1)
    expect(failing.stats().listening).toBe(false)
    a.release()
    b.release()
  })
})
