import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { outcomeWaits, keysPolledAtOnce, type OutcomeWaits } from '../src/gateway/outcome-waits.js'
import { StoreError } from '../src/store/db.js'
import type { Store } from '../src/store/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { gate, startUpstream, type TestUpstream } from './helpers/upstream.js'

// Issue 27: duplicates of an in-flight key polled the store each on its own, about four reads a
// second per duplicate. Now they share one poll per key, a completion by this process wakes them
// without one, and the keys polled at once are capped.

const duplicates = 50
const keyed = (key: string) => ({ headers: { 'idempotency-key': key } })
const idem = { idempotency: 'required', idempotency_wait: '60s' }

/** The store as the test sees it: its key reads counted, and a promise for the n-th duplicate found in flight. */
function watched(store: Store) {
  const counts = { reads: 0, inProgress: 0 }
  const wanted: { n: number; resolve: () => void }[] = []
  const wrapped: Store = {
    ...store,
    async getKey(tenant, key) {
      counts.reads++
      return store.getKey(tenant, key)
    },
    async reserve(command) {
      const r = await store.reserve(command)
      if (r.kind === 'in_progress') counts.inProgress++
      for (const w of wanted.filter((w) => counts.inProgress >= w.n)) w.resolve()
      return r
    },
  }
  // A turn of the event loop after the n-th reservation, every duplicate has gone on to its wait.
  const inProgress = (n: number) => new Promise<void>((resolve) => wanted.push({ n, resolve })).then(() => new Promise((r) => setImmediate(r)))
  return { store: wrapped, counts, inProgress }
}

/** Poll delays the test fires by hand: no poll happens unless the test lets it. */
function manualDelays() {
  const pending: (() => void)[] = []
  return { pending, delay: () => new Promise<void>((resolve) => pending.push(resolve)), fire: () => pending.splice(0).forEach((go) => go()) }
}

describe.each(backends())('duplicates waiting on an in-flight key on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let release: () => void
  const gateways: TestGateway[] = []

  beforeEach(async () => {
    t = await backend.open()
    const held = gate()
    release = held.open
    let calls = 0
    upstream = await startUpstream(async (_req, res) => {
      const n = ++calls
      await held.opened
      res.writeHead(201, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ charge: n }))
    })
  })
  afterEach(async () => {
    release()
    await Promise.all(gateways.splice(0).map((g) => g.close()))
    await upstream.close()
    await t.close()
  })

  async function gateway(store: Store, waits: OutcomeWaits): Promise<TestGateway> {
    const gw = await startTestGateway({ config: testConfig([route(upstream.url, { ...idem, fence: 'off' })]), store, outcomeWaits: waits })
    gateways.push(gw)
    return gw
  }
  const capture = (gw: TestGateway, invoice = '42') => `${gw.url}/payments/${invoice}/capture`

  it(`a completion by this process wakes its ${duplicates} duplicates at once, with no poll at all`, async () => {
    const s = watched(t.store)
    // No poll ever fires: only the completion can answer the duplicates.
    const clock = manualDelays()
    const waits = outcomeWaits(s.store, { maxKeys: 4, delay: clock.delay })
    const gw = await gateway(s.store, waits)
    const original = post(capture(gw), undefined, keyed('storm'))
    await upstream.arrived(1)
    const all = Array.from({ length: duplicates }, () => post(capture(gw), undefined, keyed('storm')))
    await s.inProgress(duplicates)
    expect(waits.waiting()).toEqual({ keys: 1, waiters: duplicates })
    // One poll is scheduled for the key, not one per duplicate.
    expect(clock.pending).toHaveLength(1)
    release()
    const answers = await Promise.all([original, ...all])
    expect(answers.map((a) => [a.status, a.text])).toEqual(Array(duplicates + 1).fill([201, '{"charge":1}']))
    expect(answers.filter((a) => a.headers.get('idempotent-replayed') === 'true')).toHaveLength(duplicates)
    expect(upstream.received).toHaveLength(1)
    expect(s.counts.reads).toBe(0)
    expect(waits.waiting()).toEqual({ keys: 0, waiters: 0 })
  })

  it(`a completion by another process reaches the ${duplicates} duplicates through one poll: one key read for all`, async () => {
    const s = watched(t.store)
    const clock = manualDelays()
    const waits = outcomeWaits(s.store, { maxKeys: 4, delay: clock.delay })
    const here = await gateway(s.store, waits)
    // Another worker: its own process state over the same database.
    const there = await gateway(t.store, outcomeWaits(t.store, { maxKeys: 4 }))
    const original = post(capture(there), undefined, keyed('elsewhere'))
    await upstream.arrived(1)
    const all = Array.from({ length: duplicates }, () => post(capture(here), undefined, keyed('elsewhere')))
    await s.inProgress(duplicates)
    expect(clock.pending).toHaveLength(1)
    // A poll while the original is still in flight reads once and schedules the next.
    clock.fire()
    await new Promise<void>((resolve) => { const check = () => (clock.pending.length === 1 ? resolve() : setImmediate(check)); check() })
    expect(s.counts.reads).toBe(1)
    release()
    expect((await original).status).toBe(201)
    clock.fire()
    const answers = await Promise.all(all)
    expect(answers.map((a) => [a.status, a.text, a.headers.get('idempotent-replayed')])).toEqual(Array(duplicates).fill([201, '{"charge":1}', 'true']))
    expect(s.counts.reads).toBe(2)
    expect(upstream.received).toHaveLength(1)
  })

  it('polls at most maxKeys keys at once: a duplicate of one more key is answered as when its wait ran out', async () => {
    const s = watched(t.store)
    const waits = outcomeWaits(s.store, { maxKeys: 1, delay: manualDelays().delay })
    const gw = await gateway(s.store, waits)
    const first = post(capture(gw, '1'), undefined, keyed('one'))
    const second = post(capture(gw, '2'), undefined, keyed('two'))
    await upstream.arrived(2)
    const waiting = post(capture(gw, '1'), undefined, keyed('one'))
    await s.inProgress(1)
    expect(waits.waiting()).toEqual({ keys: 1, waiters: 1 })
    // Key `one` takes the budget; `two`'s duplicate is not held for its 60 s wait.
    const refused = await post(capture(gw, '2'), undefined, keyed('two'))
    expect([refused.status, refused.json.code]).toEqual([409, 'request_in_progress'])
    expect(Number(refused.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    // Another duplicate of the key already polled joins its wait at no cost.
    const joined = post(capture(gw, '1'), undefined, keyed('one'))
    await s.inProgress(3)
    expect(waits.waiting()).toEqual({ keys: 1, waiters: 2 })
    release()
    const answers = await Promise.all([first, second, waiting, joined])
    expect(answers.map((a) => a.status)).toEqual([201, 201, 201, 201])
    expect(answers.map((a) => a.headers.get('idempotent-replayed'))).toEqual([null, null, 'true', 'true'])
  })

  it('a failed poll fails its waiters as the store being down, and frees the key', async () => {
    const clock = manualDelays()
    const failing: Store = { ...t.store, getKey: () => Promise.reject(new StoreError('08006', undefined)) }
    const s = watched(failing)
    const waits = outcomeWaits(s.store, { maxKeys: 1, delay: clock.delay })
    const gw = await gateway(s.store, waits)
    const original = post(capture(gw), undefined, keyed('down'))
    await upstream.arrived(1)
    const duplicate = post(capture(gw), undefined, keyed('down'))
    await s.inProgress(1)
    clock.fire()
    const refused = await duplicate
    expect([refused.status, refused.json.code]).toEqual([503, 'store_unavailable'])
    expect(waits.waiting()).toEqual({ keys: 0, waiters: 0 })
    release()
    expect((await original).status).toBe(201)
  })
})

describe('keysPolledAtOnce', () => {
  it('is half the process\'s store connections, at least one', () => {
    expect([1, 2, 3, 20, 100].map(keysPolledAtOnce)).toEqual([1, 1, 1, 10, 50])
  })
})
