import { describe, expect, it } from 'vitest'
import { FencegateClient, type FetchLike, type Job, type Lease, type WorkEvent } from '../src/client/index.js'
import { createJobStore } from '../src/leases/store.js'
import { backends } from './helpers/backends.js'
import { freshGateway } from './helpers/fresh-gateway.js'
import { route, testConfig } from './helpers/gateway.js'
import { supersede as takeOver } from './helpers/successor.js'

// A 2 s lease renews every 667 ms: a cancel or a successor reaches the worker at its next heartbeat.
const jobTypes = [{ name: 'quick', lease: '2s', max_attempts: 5, backoff: '1s' }]

/** The real fetch, noting each claim's `max`, how many jobs it got, and every call under a lease. */
function recordingFetch() {
  const claims: { max: unknown; got: number }[] = []
  const calls: string[] = []
  const fetchImpl: FetchLike = async (input, init) => {
    const path = new URL(String(input)).pathname
    calls.push(path)
    const res = await fetch(input, init)
    if (!path.endsWith('/claim')) return res
    const text = await res.text()
    claims.push({ max: JSON.parse(String(init!.body)).max, got: text ? (JSON.parse(text).jobs?.length ?? 1) : 0 })
    return new Response(text || null, { status: res.status, headers: res.headers })
  }
  return { claims, fetch: fetchImpl, sent: (suffix: string) => calls.filter((c) => c.endsWith(suffix)).length }
}

/** The worker's events, and a way to wait for a condition on them (failing after 15 s, not hanging). */
function eventLog() {
  const events: WorkEvent[] = []
  const waiters = new Set<() => void>()
  const onEvent = (e: WorkEvent) => {
    events.push(e)
    for (const wake of [...waiters]) wake()
  }
  const when = (what: string, check: (events: WorkEvent[]) => boolean) => new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      waiters.delete(wake)
      reject(new Error(`never saw ${what}; the last events: ${JSON.stringify(events.slice(-12))}`))
    }, 15_000)
    const wake = () => {
      if (!check(events)) return
      waiters.delete(wake)
      clearTimeout(timer)
      resolve()
    }
    waiters.add(wake)
    wake()
  })
  const of = (type: WorkEvent['type']) => events.filter((e) => e.type === type)
  return { events, onEvent, when, of }
}

/** A promise the test settles: the handler that awaits it ignores everything else, lease.signal included. */
function gate() {
  let open!: () => void
  const opened = new Promise<void>((r) => (open = r))
  return { opened, open }
}

const aborted = (signal: AbortSignal) => new Promise<void>((r) => (signal.aborted ? r() : signal.addEventListener('abort', () => r(), { once: true })))

describe.each(backends())('draining slots of the worker SDK on $name', (backend) => {
  const fx = freshGateway(backend, ({ t, upstream }) => ({ config: testConfig([route(upstream.url)], { job_types: jobTypes }), jobs: createJobStore(t.db) }))

  const startJobs = async (client: FencegateClient, n: number) => {
    const ids: string[] = []
    // One at a time, so the queue order (run_after, id) is the order they were started in.
    for (let i = 0; i < n; i++) ids.push((await client.start({ type: 'quick', key: `j${i}` })).job_id)
    return ids
  }
  const cancel = (jobId: string) => fetch(`${fx.gw.url}/_fencegate/jobs/${jobId}/cancel`, { method: 'POST' })
  /** A successor takes the job: its lease is moved into the past on the database clock and another worker claims it. */
  const supersede = async (jobId: string) => {
    const next = await takeOver(fx.t.db, fx.gw.url, { jobId, type: 'quick', workerId: 'w2' })
    expect([next.job.id, next.job.fence]).toEqual([jobId, '2'])
    return next.lease
  }
  const state = async (jobId: string) => (await fx.t.db.sql<{ state: string; fence: string; owner: string | null }>`
    SELECT state, fence::text, owner FROM fg_jobs WHERE id = ${jobId}::bigint`)[0]

  it('a handler that ignores its lost lease keeps its slot until it settles: no claim while both slots drain, one claim when one frees, and shutdown names the stuck job', async () => {
    const rec = recordingFetch()
    const client = new FencegateClient({ baseUrl: fx.gw.url, fetch: rec.fetch })
    const [, , third, fourth] = await startJobs(client, 4)
    const log = eventLog()
    const stop = new AbortController()
    const gates = new Map<string, ReturnType<typeof gate>>()
    const handler = async (job: Job) => {
      // The first two ignore their leases and hang until the test lets them go; the third finishes on shutdown.
      if (gates.size < 2) {
        const g = gate()
        gates.set(job.id, g)
        await g.opened
        return { late: true }
      }
      await aborted(stop.signal)
      return { finished: 'in grace' }
    }
    const graceMs = 1000
    const working = client.work({ types: ['quick'], concurrency: 2, signal: stop.signal, claimWait: 1, shutdownGraceMs: graceMs, onEvent: log.onEvent }, handler)
    await log.when('two claims', (es) => es.filter((e) => e.type === 'claimed').length === 2)
    const [a, b] = log.of('claimed').map((e) => e.jobId) as [string, string]

    // An operator cancels a: its handler runs on, holding its slot; one slot of two draining is not all of them.
    expect((await cancel(a)).status).toBe(200)
    await log.when('a draining', (es) => es.some((e) => e.type === 'draining' && e.jobId === a))
    expect(client.drainingSlots).toBe(1)
    // A successor takes b: now both slots drain, and the worker says so once.
    const successor = await supersede(b)
    await log.when('all slots draining', (es) => es.some((e) => e.type === 'all_slots_draining'))
    expect(client.drainingSlots).toBe(2)
    expect(rec.claims).toEqual([{ max: 2, got: 2 }])

    // b's handler settles: its slot frees, and exactly one job is claimed for it.
    gates.get(b)!.open()
    await log.when('a third claim', (es) => es.filter((e) => e.type === 'claimed').length === 3)
    expect(client.drainingSlots).toBe(1)
    expect(log.events.map((e) => [e.type, e.jobId])).toEqual([
      ['claimed', a], ['claimed', b],
      ['cancelled', a], ['draining', a],
      ['lost', b], ['draining', b], ['all_slots_draining', b],
      ['drained', b], ['claimed', third],
    ])
    expect(log.of('draining')).toEqual([
      { type: 'draining', jobId: a, jobType: 'quick', fence: '1', why: 'cancelled', slotsDraining: 1 },
      { type: 'draining', jobId: b, jobType: 'quick', fence: '1', why: 'lost', slotsDraining: 2 },
    ])
    expect(log.of('all_slots_draining')).toEqual([{ type: 'all_slots_draining', jobId: b, slots: 2 }])
    expect(log.of('drained')).toEqual([{ type: 'drained', jobId: b, jobType: 'quick', fence: '1', durationMs: expect.any(Number), slotsDraining: 1 }])

    // Shutdown: the third job finishes within the grace period, a never settles and is named; work() does not hang on it.
    const stoppedAt = performance.now()
    stop.abort()
    const result = await working
    const tookMs = performance.now() - stoppedAt
    expect(result).toEqual({ unsettled: [a] })
    expect(tookMs).toBeGreaterThanOrEqual(graceMs - 50)
    expect(tookMs).toBeLessThan(graceMs + 2000)
    expect(log.events.slice(9).map((e) => e.type)).toEqual(['completed'])
    expect(rec.claims).toEqual([{ max: 2, got: 2 }, { max: 1, got: 1 }])
    // Nothing was sent under the lost leases: one completion (the third job's), and no release or fail for b.
    expect([rec.sent('/complete'), rec.sent('/release')]).toEqual([1, 0])
    expect(await state(a)).toMatchObject({ state: 'cancelled' })
    expect(await state(b)).toMatchObject({ state: 'running', fence: '2', owner: 'w2' })
    expect(await state(third!)).toMatchObject({ state: 'succeeded' })
    expect(await state(fourth!)).toMatchObject({ state: 'queued', fence: '0' })
    gates.get(a)!.open()
    await successor.complete({ by: 'w2' })
  })

  it('with one slot, a handler that releases its own lease and runs on drains that slot before the next claim', async () => {
    const rec = recordingFetch()
    const client = new FencegateClient({ baseUrl: fx.gw.url, fetch: rec.fetch })
    const [first, second] = await startJobs(client, 2)
    const log = eventLog()
    const stop = new AbortController()
    const hold = gate()
    // Stopped as the second job completes, so no claim follows it.
    const onEvent = (e: WorkEvent) => {
      log.onEvent(e)
      if (e.type === 'completed') stop.abort()
    }
    const working = client.work({ types: ['quick'], signal: stop.signal, claimWait: 1, onEvent }, async (job, lease: Lease) => {
      if (job.id !== first) return { second: true }
      await lease.release()
      await hold.opened
      return { ignored: true }
    })
    await log.when('the first job draining', (es) => es.some((e) => e.type === 'draining'))
    // One slot of one: all of them drain, and no claim is sent for it.
    expect(log.of('all_slots_draining')).toEqual([{ type: 'all_slots_draining', jobId: first, slots: 1 }])
    expect(rec.claims).toEqual([{ max: undefined, got: 1 }])
    hold.open()
    expect(await working).toEqual({ unsettled: [] })
    expect(log.events.map((e) => [e.type, e.jobId])).toEqual([
      ['claimed', first], ['released', first], ['draining', first], ['all_slots_draining', first],
      ['drained', first], ['claimed', second], ['completed', second],
    ])
    expect(log.of('draining')).toMatchObject([{ why: 'released' }])
    expect(await state(first!)).toMatchObject({ state: 'queued' })
  })

  it('control: a handler that stops on lease.signal frees its slot at once, never drains, and shutdown leaves nothing unsettled', async () => {
    const rec = recordingFetch()
    const client = new FencegateClient({ baseUrl: fx.gw.url, fetch: rec.fetch })
    const [, , third] = await startJobs(client, 3)
    const log = eventLog()
    const stop = new AbortController()
    let cooperative: string | undefined
    const working = client.work({ types: ['quick'], concurrency: 2, signal: stop.signal, claimWait: 1, shutdownGraceMs: 5000, onEvent: log.onEvent }, async (job, lease) => {
      // The first job claimed stops as soon as its lease ends; the others run until shutdown.
      cooperative ??= job.id
      await (job.id === cooperative ? aborted(lease.signal) : aborted(stop.signal))
      return { done: job.id }
    })
    await log.when('two claims', (es) => es.filter((e) => e.type === 'claimed').length === 2)
    const [a, b] = log.of('claimed').map((e) => e.jobId) as [string, string]
    expect(a).toBe(cooperative)
    expect((await cancel(a)).status).toBe(200)
    await log.when('a third claim', (es) => es.filter((e) => e.type === 'claimed').length === 3)
    expect(client.drainingSlots).toBe(0)
    stop.abort()
    expect(await working).toEqual({ unsettled: [] })
    const seen = log.events.map((e) => [e.type, e.jobId])
    expect(seen.slice(0, 4)).toEqual([['claimed', a], ['claimed', b], ['cancelled', a], ['claimed', third]])
    expect(seen.slice(4).sort()).toEqual([['completed', b], ['completed', third]].sort())
    expect(rec.claims).toEqual([{ max: 2, got: 2 }, { max: 1, got: 1 }])
  })
})
