/**
 * Waiting claims share their fallback poll and are capped per tenant (a security review's
 * finding: each waiting claim polled the store once a second on its own, with no cap, so
 * 300 waiters cost about 300 claim statements a second). The polls are fired by hand (an
 * injected ticker), and the store's statements are counted, so nothing here depends on time.
 */
import { afterEach, describe, expect, it } from 'vitest'
import { createJobStore } from '../src/leases/store.js'
import { createClaimWake, TooManyWaiting, type Ticker } from '../src/leases/wake.js'
import { backends, type TestDb } from './helpers/backends.js'
import { call, serveClaims, until, waitJobTypes, type ClaimGateway } from './helpers/claim-gateway.js'
import { counting } from './helpers/counting.js'
import { route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'

/** A ticker fired by the test: `fire()` is one tick of every poll group's clock. */
function manualTicker() {
  const clocks = new Set<() => void>()
  const ticker: Ticker = (_ms, onTick) => {
    clocks.add(onTick)
    return () => void clocks.delete(onTick)
  }
  return { ticker, fire: () => [...clocks].forEach((onTick) => onTick()), clocks: () => clocks.size }
}

describe.each(backends())('shared claim polls on $name', (backend) => {
  let t: TestDb
  let gw: ClaimGateway | undefined
  let plain: TestGateway | undefined
  afterEach(async () => {
    await gw?.close()
    await plain?.close()
    gw = plain = undefined
    await t.close()
  })
  const open = async (maxWaitingPerTenant = 100) => {
    t = await backend.open()
    const db = counting(t.db)
    const clock = manualTicker()
    gw = await serveClaims(t, { ticker: clock.ticker, maxWaitingPerTenant }, db)
    return { gw, db, clock }
  }
  const waiting = (g: ClaimGateway, n: number, types: string[] = ['report']) =>
    Array.from({ length: n }, (_, i) => call(`${g.url}/claim`, { worker_id: `${types[0]}-${i}`, types, wait: 25 }))
  const waitingIs = (g: ClaimGateway, n: number) => until(`${n} claims wait`, () => g.wake.stats().waiting === n && g.wake.stats().listening)

  it('N waiting claims of one tenant and types make one claim statement per fallback poll, not N (300 waiters cost 300 a second)', async () => {
    const { gw, db, clock } = await open()
    const reports = waiting(gw, 20)
    const others = waiting(gw, 5, ['other'])
    await waitingIs(gw, 25)
    const before = db.count
    for (let i = 1; i <= 5; i++) {
      clock.fire()
      await until(`poll ${i} ran`, () => db.count >= before + 2 * i && gw.wake.stats().waiting === 25)
    }
    // Five ticks, two groups: ten claim statements, where each of the 25 waiters used to make its own.
    expect(db.count - before).toBe(10)
    // Two groups (report, other), each on its own clock.
    expect(gw.wake.stats()).toMatchObject({ ticks: 10, waiting: 25, registered: 25, groups: 2 })
    expect(clock.clocks()).toBe(2)
    // The waiters are still served: one job each, by notification.
    const started = await call(`${gw.url}/bulk`, { jobs: Array.from({ length: 25 }, (_, i) => ({ type: i < 20 ? 'report' : 'other', key: `k${i}` })) })
    const answers = await Promise.all([...reports, ...others])
    expect(answers.map((a) => a.status)).toEqual(Array(25).fill(200))
    expect(new Set(answers.map((a) => a.json.job_id))).toEqual(new Set(started.json.jobs.map((j: { job_id: string }) => j.job_id)))
    expect(gw.wake.stats()).toMatchObject({ registered: 0, groups: 0 })
    expect(clock.clocks()).toBe(0)
  })

  it('a poll that claims a job hands the poll on: one tick serves every waiter when jobs turn claimable without a notification', async () => {
    const { gw, db, clock } = await open()
    const n = 12
    const started = await call(`${gw.url}/bulk`, { jobs: Array.from({ length: n }, (_, i) => ({ type: 'report', key: `k${i}` })) })
    // A worker took them all and went away: their leases expire, which notifies no one.
    expect((await call(`${gw.url}/claim`, { worker_id: 'gone', max: n })).json.jobs).toHaveLength(n)
    const answers = waiting(gw, n)
    await waitingIs(gw, n)
    await t.db.sql`UPDATE fg_jobs SET lease_until = now() - interval '1 second'`
    const before = db.count
    clock.fire()
    const got = await Promise.all(answers)
    // Each waiter got one of the jobs, each on its second attempt, and exactly one claim statement ran per job.
    expect(got.map((a) => [a.status, a.json.fence])).toEqual(Array(n).fill([200, '2']))
    expect(new Set(got.map((a) => a.json.job_id))).toEqual(new Set(started.json.jobs.map((j: { job_id: string }) => j.job_id)))
    expect(db.count - before).toBe(n)
    expect(gw.wake.stats()).toMatchObject({ ticks: 1, notified: 0, registered: 0 })
  })

  it('refuses a tenant\'s waiting claim beyond the cap with 429 too_many_waiting_claims and Retry-After, before any statement', async () => {
    const { gw, db } = await open(3)
    const held = waiting(gw, 3)
    await waitingIs(gw, 3)
    const before = db.count
    const refused = await call(`${gw.url}/claim`, { worker_id: 'fourth', types: ['report'], wait: 5 })
    expect([refused.status, refused.retryAfter]).toEqual([429, '1'])
    expect(refused.json).toMatchObject({ code: 'too_many_waiting_claims', waiting_limit: 3 })
    expect(db.count).toBe(before)
    // A claim without wait is not held, so the cap does not apply to it.
    expect((await call(`${gw.url}/claim`, { worker_id: 'now', types: ['report'] })).status).toBe(204)
    // The three held claims are served as usual, and their places are free again.
    const started = await call(`${gw.url}/bulk`, { jobs: [0, 1, 2].map((i) => ({ type: 'report', key: `k${i}` })) })
    expect((await Promise.all(held)).map((a) => a.json.job_id).sort()).toEqual(started.json.jobs.map((j: { job_id: string }) => j.job_id).sort())
    const next = waiting(gw, 3)
    await waitingIs(gw, 3)
    await call(`${gw.url}/bulk`, { jobs: [3, 4, 5].map((i) => ({ type: 'report', key: `k${i}` })) })
    expect((await Promise.all(next)).map((a) => a.status)).toEqual([200, 200, 200])
  })

  it('the cap is job_waiting_claims from the configuration when no wake is injected', async () => {
    t = await backend.open()
    const db = counting(t.db)
    const config = testConfig([route('http://127.0.0.1:9')], { job_types: waitJobTypes, job_waiting_claims: 1 })
    plain = await startTestGateway({ config, store: t.store, jobs: createJobStore(db) })
    const leaving = new AbortController()
    const first = call(`${plain.url}/_fencegate/jobs/claim`, { worker_id: 'w1', wait: 25 }, { signal: leaving.signal }).catch((err: unknown) => err)
    // Its first attempt is its first statement, made once it holds its place.
    await until('the first claim tried once', () => db.count === 1)
    const refused = await call(`${plain.url}/_fencegate/jobs/claim`, { worker_id: 'w2', wait: 1 })
    expect([refused.status, refused.json.code]).toEqual([429, 'too_many_waiting_claims'])
    leaving.abort()
    expect(await first).toBeInstanceOf(Error)
  })
})

describe('the claim wake\'s cap and groups on their own', () => {
  it('caps each tenant on its own, and a released waiter frees its place', async () => {
    const wake = createClaimWake({ maxWaitingPerTenant: 2, ticker: manualTicker().ticker })
    const far = () => performance.now() + 60_000
    const a = await wake.register(['report'], far(), 'acme')
    const b = await wake.register(['other'], far(), 'acme')
    await expect(wake.register(['report'], far(), 'acme')).rejects.toEqual(new TooManyWaiting('acme', 2))
    const g = await wake.register(['report'], far(), 'globex')
    a.release()
    const c = await wake.register(['report'], far(), 'acme')
    expect(wake.stats()).toMatchObject({ registered: 3, groups: 3 })
    for (const w of [b, c, g]) w.release()
    expect(wake.stats()).toMatchObject({ registered: 0, groups: 0 })
    expect(() => createClaimWake({ maxWaitingPerTenant: 0 })).toThrow(/maxWaitingPerTenant/)
  })

  it('a poll goes to a waiting member first; one that claimed hands it on, and one left unmade goes to another member', async () => {
    const clock = manualTicker()
    const wake = createClaimWake({ ticker: clock.ticker })
    const far = () => performance.now() + 60_000
    const never = new AbortController().signal
    // Types named in another order are the same group.
    const a = await wake.register(['report', 'other'], far(), 'acme')
    const b = await wake.register(['other', 'report'], far(), 'acme')
    const c = await wake.register(['report', 'other'], far(), 'acme')
    expect(wake.stats().groups).toBe(1)
    const woken: string[] = []
    const watch = (name: string, w: typeof a) => void w.next(far(), never).then((why) => woken.push(`${name}:${why}`))
    // `a` and `b` are not waiting (their attempts run): `c`, blocked, makes the poll.
    watch('c', c)
    clock.fire()
    await until('c woke', () => woken.length === 1)
    expect(woken).toEqual(['c:tick'])
    // `c` claimed a job with it: the poll goes on to `a` (first in turn), kept for its next wait;
    // `a` leaves without making it, so it goes on to `b`, which makes it when it next waits.
    c.release(true)
    a.release()
    watch('b', b)
    await until('b woke', () => woken.length === 2)
    expect(woken).toEqual(['c:tick', 'b:tick'])
    b.release()
    expect(wake.stats()).toMatchObject({ ticks: 1, registered: 0, groups: 0 })
    expect(clock.clocks()).toBe(0)
  })
})
