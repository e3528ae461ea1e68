import { Resend } from 'resend'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { jsonOf, recipeRoutes, startFakeApi, type FakeApi } from './helpers/fake-api.js'
import { startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'

/**
 * A Resend-like upstream: `POST /emails` answering `{ id }`, Resend's own de-duplication by
 * `Idempotency-Key` (the same payload replays, another is `409 invalid_idempotent_request`),
 * and a subject of `fault:reset`, `fault:slow` or `fault:stall`.
 */
function startFakeResend(): Promise<FakeApi> {
  return startFakeApi({
    keyOf: (req) => (req.headers['idempotency-key'] as string | undefined),
    faultOf: (req) => ({ 'fault:reset': 'reset', 'fault:slow': 'slow', 'fault:stall': 'stall' } as const)[String(jsonOf(req).subject) as 'fault:reset'],
    execute: (_req, n) => ({ status: 200, body: { id: `49a3999c-0ce1-4ea6-ab68-afcd6dc2e7${String(n).padStart(2, '0')}` } }),
    reused: () => ({ status: 409, body: { statusCode: 409, name: 'invalid_idempotent_request', message: 'Same idempotency key used with a different request payload.' } }),
  })
}

describe.each(backends())('the official Resend SDK through fencegate, on $name', (backend) => {
  let t: TestDb
  let fake: FakeApi
  let gw: TestGateway
  let resend: Resend

  beforeAll(async () => {
    t = await backend.open()
    fake = await startFakeResend()
    gw = await startTestGateway({ config: testConfig(recipeRoutes('resend', fake.upstream.url)), store: t.store })
    resend = new Resend('re_test_fencegate', { baseUrl: gw.url })
  })
  afterAll(async () => {
    await gw?.close()
    await fake?.close()
    await t?.close()
  })

  const email = (to: string, subject = 'Your invoice') => ({ from: 'billing@example.com', to, subject, html: '<p>Invoice attached.</p>' })
  /** The error of a call that must not succeed: Resend returns failures instead of throwing. */
  const failed = async (call: ReturnType<Resend['emails']['send']>) => {
    const { data, error } = await call
    if (data !== null || error === null) throw new Error(`succeeded as ${JSON.stringify(data)}`)
    return error as typeof error & Record<string, unknown>
  }

  it('sends once; the retry with its key gets the replay', async () => {
    const first = await resend.emails.send(email('plain@example.com'), { idempotencyKey: 'plain' })
    const again = await resend.emails.send(email('plain@example.com'), { idempotencyKey: 'plain' })
    expect(first.error).toBeNull()
    expect(first.data!.id).toMatch(/^49a3999c-/)
    expect(again.data!.id).toBe(first.data!.id)
    expect(again.headers!['idempotent-replayed']).toBe('true')
    expect(fake.executions.get('plain')).toBe(1)
    expect(fake.arrivals('plain')).toBe(1)
    expect(fake.upstream.received.at(-1)!.headers.authorization).toBe('Bearer re_test_fencegate')
  })

  it('a reset after Resend accepted the e-mail: the SDK returns the 502, the call again with the key is forwarded and replayed: one e-mail', async () => {
    const lost = await failed(resend.emails.send(email('reset@example.com', 'fault:reset'), { idempotencyKey: 'reset' }))
    expect(lost).toMatchObject({ code: 'upstream_unreachable', status: 502, name: 'upstream_unreachable', statusCode: 502 })
    const again = await resend.emails.send(email('reset@example.com', 'fault:reset'), { idempotencyKey: 'reset' })
    expect(again.error).toBeNull()
    expect(again.data!.id).toMatch(/^49a3999c-/)
    expect(fake.executions.get('reset')).toBe(1)
    expect(fake.arrivals('reset')).toBe(2)
  })

  it('Resend slower than the caller\'s signal: the SDK returns an application_error, the call again with the key gets the one e-mail', async () => {
    const gaveUp = await failed(resend.emails.send(email('slow@example.com', 'fault:slow'), { idempotencyKey: 'slow', signal: AbortSignal.timeout(300) }))
    expect(gaveUp).toMatchObject({ name: 'application_error', statusCode: null })
    const again = resend.emails.send(email('slow@example.com', 'fault:slow'), { idempotencyKey: 'slow' })
    fake.releaseSlow()
    const { data, error } = await again
    expect(error).toBeNull()
    expect(data!.id).toMatch(/^49a3999c-/)
    expect(fake.executions.get('slow')).toBe(1)
    expect(fake.arrivals('slow')).toBe(1)
  })

  it('Resend slower than the route\'s timeout_ms: the SDK returns the 504, the call again with the key is forwarded and replayed: one e-mail', async () => {
    const quick = await startTestGateway({ config: testConfig(recipeRoutes('resend', fake.upstream.url).map((r) => ({ ...r, timeout_ms: 300 }))), store: t.store })
    try {
      const client = new Resend('re_test_fencegate', { baseUrl: quick.url })
      const late = await failed(client.emails.send(email('stall@example.com', 'fault:stall'), { idempotencyKey: 'stall' }))
      expect(late).toMatchObject({ code: 'upstream_timeout', status: 504, name: 'upstream_timeout', statusCode: 504 })
      const again = await client.emails.send(email('stall@example.com', 'fault:stall'), { idempotencyKey: 'stall' })
      expect(again.error).toBeNull()
      expect(again.data!.id).toMatch(/^49a3999c-/)
      expect(fake.executions.get('stall')).toBe(1)
      expect(fake.arrivals('stall')).toBe(2)
    } finally {
      await quick.close()
    }
  })

  it('20 concurrent sends on 5 keys: 5 e-mails, and every caller gets its key\'s id', async () => {
    fake.holdUntilNames(5)
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => resend.emails.send(email(`conc-${i % 5}@example.com`), { idempotencyKey: `conc-${i % 5}` })))
    fake.holdUntilNames(0)
    for (let k = 0; k < 5; k++) {
      const mine = results.filter((_, i) => i % 5 === k)
      expect(mine.map((r) => r.error)).toEqual([null, null, null, null])
      expect(new Set(mine.map((r) => r.data!.id)).size).toBe(1)
      expect(fake.executions.get(`conc-${k}`)).toBe(1)
      expect(fake.arrivals(`conc-${k}`)).toBe(1)
    }
  })

  it('the same key with another message: an error, never forwarded', async () => {
    await resend.emails.send(email('same@example.com'), { idempotencyKey: 'same' })
    const err = await failed(resend.emails.send(email('same@example.com', 'Another subject'), { idempotencyKey: 'same' }))
    expect(err).toMatchObject({ code: 'idempotency_key_reused', status: 422 })
    // Resend's own fields, from the recipe's error_envelope: resend.
    expect([err.name, err.message, err.statusCode]).toEqual(['idempotency_key_reused', 'this Idempotency-Key was used with a different method, path, query or body', 422])
    expect(fake.arrivals('same')).toBe(1)
  })

  it('a stale fence in the request headers: an error, never forwarded, one audit row', async () => {
    expect((await resend.emails.send(email('fenced@example.com'), { idempotencyKey: 'fence-5', headers: { 'X-Execution-Fence': '5' } })).error).toBeNull()
    const err = await failed(resend.emails.send(email('fenced@example.com'), { idempotencyKey: 'fence-4', headers: { 'X-Execution-Fence': '4' } }))
    expect(err).toMatchObject({ code: 'stale_fence', status: 409, detail: expect.stringMatching(/fence 4 is lower than 5/) })
    // Resend's own error fields, from the recipe's error_envelope: resend.
    expect([err.name, err.message, err.statusCode]).toEqual(['stale_fence', 'fence 4 is lower than 5, the highest accepted for recipient:fenced@example.com', 409])
    expect(fake.arrivals('fence-4')).toBe(0)
    const audit = await (await fetch(`${gw.adminUrl}/audit?entity=recipient:fenced@example.com`)).json() as { items: { code: string }[] }
    expect(audit.items.filter((i) => i.code === 'stale_fence')).toHaveLength(1)
  })

  it('without the recipe\'s error_envelope line, name, message and statusCode are undefined', async () => {
    const bare = await startTestGateway({ config: testConfig(recipeRoutes('resend', fake.upstream.url).map(({ error_envelope: _, ...r }) => r)), store: t.store })
    try {
      const client = new Resend('re_test_fencegate', { baseUrl: bare.url })
      expect((await client.emails.send(email('bare@example.com'), { idempotencyKey: 'bare-5', headers: { 'X-Execution-Fence': '5' } })).error).toBeNull()
      const err = await failed(client.emails.send(email('bare@example.com'), { idempotencyKey: 'bare-4', headers: { 'X-Execution-Fence': '4' } }))
      expect(err).toMatchObject({ code: 'stale_fence', status: 409 })
      expect([err.name, err.message, err.statusCode]).toEqual([undefined, undefined, undefined])
    } finally {
      await bare.close()
    }
  })

  it('a send without idempotencyKey is refused on this route, never forwarded', async () => {
    const before = fake.upstream.received.length
    const err = await failed(resend.emails.send(email('nokey@example.com')))
    expect(err).toMatchObject({ code: 'idempotency_key_required', status: 400, name: 'idempotency_key_required', message: 'route resend-emails requires Idempotency-Key', statusCode: 400 })
    expect(fake.upstream.received).toHaveLength(before)
  })
})
