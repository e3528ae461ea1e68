import { createServer } from 'node:http'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import type { Db } from '../src/store/db.js'
import { createStore } from '../src/store/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { counting } from './helpers/counting.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { closedPort, gate, startUpstream, type TestUpstream } from './helpers/upstream.js'

const idem = (overrides: Record<string, unknown> = {}) => ({ idempotency: 'required', ...overrides })
const keyed = (key: string, extra: Record<string, string> = {}) => ({ headers: { 'idempotency-key': key, ...extra } })

describe.each(backends())('idempotency on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway
  let calls = 0

  async function start(routes: Record<string, unknown>[], db?: Db) {
    gw = await startTestGateway({ config: testConfig(routes), store: db ? createStore(db, { schedule: setImmediate }) : t.store })
  }
  const capture = (extra: string = '') => `${gw.url}/payments/42/capture${extra}`
  const audit = async (query = '') => (await (await fetch(`${gw.adminUrl}/audit?${query}`)).json()).items as any[]

  beforeEach(async () => {
    t = await backend.open()
    calls = 0
    upstream = await startUpstream((_req, res) => {
      calls++
      res.writeHead(201, { 'content-type': 'application/json', location: `/charges/${calls}`, 'set-cookie': 'session=abc', etag: `"c${calls}"`, 'x-ratelimit-remaining': '9' })
      res.end(JSON.stringify({ charge: calls }))
    })
  })
  afterEach(async () => {
    await gw?.close()
    await upstream.close()
    await t.close()
  })

  it('a double click reaches the upstream once and the duplicate gets the identical answer', async () => {
    await start([route(upstream.url, idem())])
    const first = await post(capture(), '1', keyed('click-1'))
    const second = await post(capture(), '1', keyed('click-1'))
    expect(upstream.received).toHaveLength(1)
    expect(first.status).toBe(201)
    expect(second.status).toBe(201)
    expect(second.text).toBe(first.text)
    expect(second.headers.get('location')).toBe('/charges/1')
    expect(second.headers.get('etag')).toBe('"c1"')
    expect(second.headers.get('content-type')).toBe('application/json')
    expect(second.headers.get('idempotent-replayed')).toBe('true')
    expect(first.headers.get('idempotent-replayed')).toBeNull()
    // Set-Cookie and rate-limit headers reach the first caller but are never replayed.
    expect(first.headers.get('set-cookie')).toBe('session=abc')
    expect(second.headers.get('set-cookie')).toBeNull()
    expect(second.headers.get('x-ratelimit-remaining')).toBeNull()
    // The upstream saw the key, so a deduplicating upstream can use it too.
    expect(upstream.received[0]!.headers['idempotency-key']).toBe('click-1')
  })

  it('a storm of 200 concurrent duplicates executes exactly once and answers every request', async () => {
    const { opened: held, open: release } = gate()
    upstream.handle(async (_req, res) => {
      calls++
      await held
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"charged":true}')
    })
    await start([route(upstream.url, idem())])
    const all = Array.from({ length: 200 }, () => post(capture(), '1', keyed('storm')))
    // Let the original through only once it reached the upstream, so the storm meets it in flight.
    await upstream.arrived(1)
    release()
    const answers = await Promise.all(all)
    expect(upstream.received).toHaveLength(1)
    const ok = answers.filter((a) => a.status === 200)
    const inProgress = answers.filter((a) => a.status === 409)
    expect(ok.length + inProgress.length).toBe(200)
    for (const a of ok) expect(a.text).toBe('{"charged":true}')
    for (const a of inProgress) {
      expect(a.json.code).toBe('request_in_progress')
      expect(Number(a.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    }
    expect(ok.filter((a) => a.headers.get('idempotent-replayed') === null)).toHaveLength(1)
    // Afterwards every duplicate is a replay.
    const late = await post(capture(), '1', keyed('storm'))
    expect(late.headers.get('idempotent-replayed')).toBe('true')
  })

  it('refuses a key reused with another body, path or method with 422, and audits it', async () => {
    await start([route(upstream.url, idem()), route(upstream.url, idem({ name: 'void', method: 'PUT' }))])
    await post(capture(), '1', { body: '{"amount":10}', ...keyed('reuse') })
    const otherBody = await post(capture(), '1', { body: '{"amount":11}', ...keyed('reuse') })
    const otherPath = await post(`${gw.url}/payments/43/capture`, '1', { body: '{"amount":10}', ...keyed('reuse') })
    const otherQuery = await post(capture('?x=1'), '1', { body: '{"amount":10}', ...keyed('reuse') })
    const otherMethod = await fetch(capture(), { method: 'PUT', headers: { 'x-execution-fence': '1', 'idempotency-key': 'reuse' }, body: '{"amount":10}' })
    for (const res of [otherBody, otherPath, otherQuery]) expect([res.status, res.json.code]).toEqual([422, 'idempotency_key_reused'])
    expect(otherMethod.status).toBe(422)
    expect(upstream.received).toHaveLength(1)
    const rows = await audit('code=idempotency_key_reused')
    expect(rows).toHaveLength(4)
    expect(rows[0].idempotency_key).toBe('reuse')
  })

  it('treats JSON bodies that differ only in key order as different payloads', async () => {
    await start([route(upstream.url, idem())])
    expect((await post(capture(), '1', { body: '{"a":1,"b":2}', ...keyed('order') })).status).toBe(201)
    expect((await post(capture(), '1', { body: '{"b":2,"a":1}', ...keyed('order') })).status).toBe(422)
  })

  it('releases the key on a transient status, so the next attempt forwards again', async () => {
    let status = 503
    upstream.handle((_req, res) => {
      res.writeHead(status)
      res.end(String(status))
    })
    await start([route(upstream.url, idem())])
    expect((await post(capture(), '1', keyed('busy'))).status).toBe(503)
    status = 200
    expect((await post(capture(), '1', keyed('busy'))).status).toBe(200)
    const replay = await post(capture(), '1', keyed('busy'))
    expect([replay.status, replay.headers.get('idempotent-replayed')]).toEqual([200, 'true'])
    expect(upstream.received).toHaveLength(2)
  })

  it('releases the key when the upstream refused the connection', async () => {
    const port = await closedPort()
    await start([route(`http://127.0.0.1:${port}`, idem())])
    expect((await post(capture(), '1', keyed('refused'))).json.code).toBe('upstream_unreachable')
    const late = createServer((_req, res) => res.end('late ok'))
    await new Promise<void>((resolve) => late.listen(port, '127.0.0.1', resolve))
    try {
      const res = await post(capture(), '1', keyed('refused'))
      expect([res.status, res.text]).toEqual([200, 'late ok'])
    } finally {
      late.closeAllConnections()
      await new Promise((resolve) => late.close(resolve))
    }
  })

  it('a timeout after the request was sent is an unknown outcome: duplicates get 502 (fail)', async () => {
    upstream.handle(() => {})
    await start([route(upstream.url, idem({ timeout_ms: 150 }))])
    expect((await post(capture(), '1', keyed('lost'))).json.code).toBe('upstream_timeout')
    const dup = await post(capture(), '1', keyed('lost'))
    expect([dup.status, dup.json.code]).toEqual([502, 'outcome_unknown'])
    expect(upstream.received).toHaveLength(1)
    const record = await (await fetch(`${gw.adminUrl}/idempotency/lost`)).json()
    expect(record).toMatchObject({ key: 'lost', state: 'outcome_unknown', route: 'capture' })
    expect(record).not.toHaveProperty('body')
  })

  it('with on_unknown_outcome: retry the duplicate forwards again with the same Idempotency-Key', async () => {
    let answer = false
    upstream.handle((req, res) => {
      if (answer) res.end(`done ${req.headers['idempotency-key']}`)
    })
    await start([route(upstream.url, idem({ timeout_ms: 150, on_unknown_outcome: 'retry' }))])
    expect((await post(capture(), '1', keyed('retry-me'))).status).toBe(504)
    answer = true
    const retried = await post(capture(), '1', keyed('retry-me'))
    expect([retried.status, retried.text]).toEqual([200, 'done retry-me'])
    expect(upstream.received.map((r) => r.headers['idempotency-key'])).toEqual(['retry-me', 'retry-me'])
    expect((await post(capture(), '1', keyed('retry-me'))).headers.get('idempotent-replayed')).toBe('true')
  })

  it('an in-flight record whose lock expired (a crashed gateway) becomes an unknown outcome', async () => {
    await start([route(upstream.url, idem())])
    const reservation = await t.store.reserve({
      tenant: 'default', route: 'capture', entity: 'invoice:42', fence: '1', method: 'POST', path: '/payments/42/capture',
      bodySha256: null, caller: null, requestId: 'crashed',
      idempotency: { key: 'orphan', fingerprint: 'not-this-payload', ownerToken: 'dead-gateway', lockMs: 30_000, ttlMs: 60_000, retryUnknown: false },
    })
    expect(reservation.kind).toBe('proceed')
    // Same payload as the test's request below, lock moved into the past on the database clock.
    await t.db.sql`UPDATE fg_idempotency SET fingerprint = 'x', locked_until = now() - interval '1 second'`
    expect((await post(capture(), '1', keyed('orphan'))).json.code).toBe('idempotency_key_reused')
    await t.db.sql`DELETE FROM fg_idempotency`
    const first = await post(capture(), '1', keyed('orphan'))
    expect(first.status).toBe(201)
    await t.db.sql`UPDATE fg_idempotency SET state = 'in_flight', locked_until = now() - interval '1 second'`
    const dup = await post(capture(), '1', keyed('orphan'))
    expect([dup.status, dup.json.code]).toEqual([502, 'outcome_unknown'])
  })

  it('delivers an oversize response once and refuses to execute it again', async () => {
    upstream.handle((_req, res) => {
      res.end('x'.repeat(100))
    })
    await start([route(upstream.url, idem({ max_stored_body: 16 }))])
    expect((await post(capture(), '1', keyed('big'))).text).toBe('x'.repeat(100))
    const dup = await post(capture(), '1', keyed('big'))
    expect([dup.status, dup.json.code]).toEqual([409, 'response_not_replayable'])
    expect(upstream.received).toHaveLength(1)
  })

  it('forwards a key again once its TTL has passed on the database clock', async () => {
    await start([route(upstream.url, idem())])
    await post(capture(), '1', keyed('ttl'))
    await t.db.sql`UPDATE fg_idempotency SET expires_at = now() - interval '1 second'`
    const again = await post(capture(), '1', keyed('ttl'))
    expect([again.status, again.headers.get('idempotent-replayed')]).toEqual([201, null])
    expect(upstream.received).toHaveLength(2)
    expect(await t.store.purgeExpired(100)).toBe(0)
    await t.db.sql`UPDATE fg_idempotency SET expires_at = now() - interval '1 second'`
    expect(await t.store.purgeExpired(100)).toBe(1)
  })

  it('checks the fence first: a stale fence is rejected even when a replay exists; a new owner gets the replay', async () => {
    await start([route(upstream.url, idem())])
    await post(capture(), '5', keyed('owner'))
    const newOwner = await post(capture(), '6', keyed('owner'))
    expect([newOwner.status, newOwner.headers.get('idempotent-replayed')]).toEqual([201, 'true'])
    const stale = await post(capture(), '5', keyed('owner'))
    expect([stale.status, stale.json.code, stale.json.highest_fence]).toEqual([409, 'stale_fence', '6'])
    expect(upstream.received).toHaveLength(1)
    // The stale audit names the key it came with, so an operator can find the command.
    expect(await audit('code=stale_fence')).toMatchObject([{ idempotency_key: 'owner', presented_fence: '5', highest_fence: '6' }])
  })

  it('does not pass an inbound Idempotent-Replayed header on or echo it back', async () => {
    await start([route(upstream.url, idem())])
    const res = await post(capture(), '1', keyed('echo', { 'idempotent-replayed': 'true' }))
    expect(res.headers.get('idempotent-replayed')).toBeNull()
    expect(upstream.received[0]!.headers['idempotent-replayed']).toBeUndefined()
  })

  it('validates the header: missing on a required route, empty, lists, two headers, over-long', async () => {
    await start([route(upstream.url, idem())])
    expect((await post(capture(), '1')).json.code).toBe('idempotency_key_required')
    for (const bad of ['""', '"a", "b"', 'a, b', 'x'.repeat(256), '"unterminated', 'sp ace']) {
      const res = await post(capture(), '1', keyed(bad))
      expect([res.status, res.json.code], bad).toEqual([400, 'invalid_idempotency_key'])
    }
    expect((await post(capture(), '1', keyed('"quoted-\\"key"'))).status).toBe(201)
    // Forwarded in the one form the key has (a bare token here), whichever spelling it came in.
    expect(upstream.received.map((r) => r.headers['idempotency-key'])).toEqual(['quoted-"key'])
    expect(await audit('code=invalid_idempotency_key')).toHaveLength(6)
  })

  it('lets an operator release an unknown outcome, audited, but never a completed one', async () => {
    upstream.handle(() => {})
    await start([route(upstream.url, idem({ timeout_ms: 150 }))])
    await post(capture(), '1', keyed('reconcile'))
    const released = await fetch(`${gw.adminUrl}/idempotency/reconcile`, { method: 'DELETE' })
    expect(await released.json()).toMatchObject({ released: true, previous_state: 'outcome_unknown' })
    expect(await audit('code=idempotency_key_released')).toMatchObject([{ idempotency_key: 'reconcile' }])
    upstream.handle((_req, res) => {
      res.end('second try')
    })
    expect((await post(capture(), '1', keyed('reconcile'))).text).toBe('second try')
    const refused = await fetch(`${gw.adminUrl}/idempotency/reconcile`, { method: 'DELETE' })
    expect([refused.status, (await refused.json()).code]).toEqual([409, 'key_not_releasable'])
    expect((await fetch(`${gw.adminUrl}/idempotency/never`, { method: 'DELETE' })).status).toBe(404)
  })

  it('holds a duplicate with idempotency_wait until the original completes, then replays it', async () => {
    const { opened: held, open: release } = gate()
    upstream.handle(async (_req, res) => {
      await held
      res.end('finally')
    })
    await start([route(upstream.url, idem({ idempotency_wait: '10s' }))])
    const original = post(capture(), '1', keyed('wait'))
    await upstream.arrived(1)
    const duplicate = post(capture(), '1', keyed('wait'))
    release()
    const [a, b] = await Promise.all([original, duplicate])
    expect([a.text, b.text, b.headers.get('idempotent-replayed')]).toEqual(['finally', 'finally', 'true'])
    expect(upstream.received).toHaveLength(1)
  })

  it('still records the answer when the client disconnects mid-response', async () => {
    const { opened: finished, open: finish } = gate()
    upstream.handle(async (_req, res) => {
      res.write('part one;')
      await finished
      res.end('part two')
    })
    await start([route(upstream.url, idem())])
    const controller = new AbortController()
    const res = await fetch(capture(), { method: 'POST', headers: { 'x-execution-fence': '1', 'idempotency-key': 'gone' }, body: '{}', signal: controller.signal })
    await res.body!.getReader().read()
    controller.abort()
    finish()
    // Poll the database state, not the clock, until the record settles.
    for (let i = 0; i < 500 && (await t.store.getKey('default', 'gone'))?.state === 'in_flight'; i++) await new Promise((r) => setTimeout(r, 10))
    const replay = await post(capture(), '1', keyed('gone'))
    expect([replay.text, replay.headers.get('idempotent-replayed')]).toEqual(['part one;part two', 'true'])
  })

  it('costs two store round trips for a new request and one for a replay or a rejection', async () => {
    const db = counting(t.db)
    await start([route(upstream.url, idem())], db)
    const count = async (run: () => Promise<unknown>) => {
      const before = db.count
      await run()
      return db.count - before
    }
    expect(await count(() => post(capture(), '5', keyed('budget')))).toBe(2)
    expect(await count(() => post(capture(), '5', keyed('budget')))).toBe(1)
    expect(await count(() => post(capture(), '4', keyed('budget')))).toBe(1)
    expect(await count(() => post(capture(), '5', { body: '{"x":1}', ...keyed('budget') }))).toBe(1)
    expect(await count(() => post(capture(), '5'))).toBe(1)
  })
})
