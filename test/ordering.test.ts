import type { ServerResponse } from 'node:http'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { staticRules } from '../src/rules/registry.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { gate, startUpstream, type TestUpstream } from './helpers/upstream.js'

describe.each(backends())('ordered delivery: ordering serialize ($name)', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway | undefined
  /** Fences in the order the upstream received them, and the most requests it ever held at once. */
  let arrivals: string[]
  let inFlight: number
  let maxInFlight: number

  beforeEach(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    arrivals = []
    inFlight = 0
    maxInFlight = 0
    upstream.handle((req, res: ServerResponse) => {
      arrivals.push(String(req.headers['x-execution-fence']))
      maxInFlight = Math.max(maxInFlight, ++inFlight)
      // The upstream takes a moment per command, so commands overlap unless the gateway serialises them.
      setTimeout(() => {
        inFlight--
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
      }, 3)
    })
  })
  afterEach(async () => {
    await gw?.close()
    gw = undefined
    await upstream.close()
    await t.close()
  })

  const start = async (overrides: Record<string, unknown>, extra: Record<string, unknown> = {}) => {
    const config = testConfig([route(upstream.url, overrides)], extra)
    gw = await startTestGateway({ config, store: t.store })
  }

  it('delivers one command per entity at a time, in non-decreasing fence order, under concurrent owners', async () => {
    await start({ ordering: 'serialize', ordering_wait: '30s' })
    const fences = Array.from({ length: 40 }, (_, i) => String(1 + ((i * 7) % 8)))
    const answers = await Promise.all(fences.map((f) => post(`${gw!.url}/payments/1/capture`, f)))
    expect(maxInFlight).toBe(1)
    expect(arrivals.length).toBeGreaterThan(0)
    for (let i = 1; i < arrivals.length; i++) expect(BigInt(arrivals[i]!) >= BigInt(arrivals[i - 1]!)).toBe(true)
    const forwarded = answers.filter((a) => a.status === 200)
    expect(forwarded).toHaveLength(arrivals.length)
    for (const a of answers.filter((x) => x.status !== 200)) {
      expect(a.status).toBe(409)
      expect(a.json.code).toBe('stale_fence')
    }
    // The newest owner always gets through: nothing newer can make it stale.
    expect(arrivals.at(-1)).toBe('8')
  })

  it('without it, the same commands overlap at the upstream (the control for the test above)', async () => {
    await start({})
    const held = gate()
    upstream.handle(async (req, res) => {
      arrivals.push(String(req.headers['x-execution-fence']))
      await held.opened
      res.writeHead(200).end('{}')
    })
    // One fence for both: with two, the lower could reach the store second and be stale.
    const answers = Promise.all([post(`${gw!.url}/payments/1/capture`, '1'), post(`${gw!.url}/payments/1/capture`, '1')])
    await upstream.arrived(2)
    held.open()
    expect((await answers).map((a) => a.status)).toEqual([200, 200])
  })

  it('keeps other entities independent', async () => {
    await start({ ordering: 'serialize' })
    const held = gate()
    upstream.handle(async (_req, res) => {
      await held.opened
      res.writeHead(200).end('{}')
    })
    const answers = Promise.all([post(`${gw!.url}/payments/1/capture`, '1'), post(`${gw!.url}/payments/2/capture`, '1')])
    await upstream.arrived(2)
    held.open()
    expect((await answers).map((a) => a.status)).toEqual([200, 200])
  })

  it('answers 409 entity_busy with Retry-After when the slot stays taken past ordering_wait, audited, key released', async () => {
    await start({ ordering: 'serialize', ordering_wait: '50ms', idempotency: 'optional' })
    expect((await post(`${gw!.url}/payments/1/capture`, '1')).status).toBe(200)
    // Another gateway holds the slot (as a crashed one would until its hold ends).
    await t.db.sql`UPDATE fg_fences SET inflight_token = 'elsewhere', inflight_fence = 1, inflight_until = now() + interval '1 hour'`
    const busy = await post(`${gw!.url}/payments/1/capture`, '1', { headers: { 'idempotency-key': 'k1' } })
    expect(busy.status).toBe(409)
    expect(busy.json).toMatchObject({ code: 'entity_busy', entity: 'invoice:1' })
    expect(Number(busy.headers.get('retry-after'))).toBeGreaterThan(3000)
    const audit = await (await fetch(`${gw!.adminUrl}/audit?code=entity_busy`)).json() as { items: unknown[] }
    expect(audit.items).toHaveLength(1)
    // The hold ends on the database clock; then the same key goes through (it was released, not burnt).
    await t.db.sql`UPDATE fg_fences SET inflight_until = now() - interval '1 second'`
    expect((await post(`${gw!.url}/payments/1/capture`, '1', { headers: { 'idempotency-key': 'k1' } })).status).toBe(200)
    expect(upstream.received).toHaveLength(2)
  })

  it('holds the slot for timeout_ms plus one second on the database clock, so a dead gateway\'s slot frees itself', async () => {
    await start({ ordering: 'serialize', timeout_ms: 4000 })
    const held = gate()
    upstream.handle(async (_req, res) => {
      await held.opened
      res.writeHead(200).end('{}')
    })
    const [before] = await t.db.sql<{ at: string }>`SELECT now()::text AS at`
    const answer = post(`${gw!.url}/payments/1/capture`, '1')
    await upstream.arrived(1)
    // Taken between the two database readings of now(), so it ends 5 s after a moment between them.
    const [row] = await t.db.sql<{ after_before: boolean; before_now: boolean }>`
      SELECT inflight_until >= ${before!.at}::timestamptz + interval '5 seconds' AS after_before,
             inflight_until <= now() + interval '5 seconds' AS before_now
      FROM fg_fences WHERE entity = 'invoice:1'`
    held.open()
    expect((await answer).status).toBe(200)
    expect(row).toEqual({ after_before: true, before_now: true })
    const [after] = await t.db.sql<{ token: string | null }>`SELECT inflight_token AS token FROM fg_fences WHERE entity = 'invoice:1'`
    expect(after!.token).toBeNull()
  })

  it('gives the slot back when the upstream fails', async () => {
    await start({ ordering: 'serialize', ordering_wait: '50ms' })
    upstream.handle((_req, res) => {
      res.socket?.destroy()
    })
    expect((await post(`${gw!.url}/payments/1/capture`, '1')).status).toBe(502)
    upstream.handle((_req, res) => {
      res.writeHead(200).end('{}')
    })
    expect((await post(`${gw!.url}/payments/1/capture`, '1')).status).toBe(200)
  })

  it('can be asked for by an entity rule on a route that does not serialise', async () => {
    const config = testConfig([route(upstream.url, { ordering_wait: '50ms' })], {
      entity_rules: [{ name: 'serial', entity_match: 'invoice:1', ordering: 'serialize' }],
    })
    gw = await startTestGateway({ config, store: t.store })
    expect(staticRules(config).current().entityRules).toHaveLength(1)
    expect((await post(`${gw.url}/payments/1/capture`, '1')).status).toBe(200)
    await t.db.sql`UPDATE fg_fences SET inflight_token = 'elsewhere', inflight_until = now() + interval '1 hour' WHERE entity = 'invoice:1'`
    expect((await post(`${gw.url}/payments/1/capture`, '1')).json.code).toBe('entity_busy')
    expect((await post(`${gw.url}/payments/2/capture`, '1')).status).toBe(200)
  })
})
