import { SquareClient, SquareError, SquareTimeoutError } from 'square'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { jsonOf, recipeRoutes, startFakeApi, type FakeApi } from './helpers/fake-api.js'
import { startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'

/**
 * A Square-like upstream: `POST /v2/payments` with the key in the JSON body, Square's own
 * de-duplication by `idempotency_key` (the same body replays, another is
 * `400 IDEMPOTENCY_KEY_REUSED` in Square's `errors[]`), and a `note` of `fault:reset`,
 * `fault:slow` or `fault:stall`.
 */
function startFakeSquare(): Promise<FakeApi> {
  return startFakeApi({
    keyOf: (req) => jsonOf(req).idempotency_key,
    faultOf: (req) => ({ 'fault:reset': 'reset', 'fault:slow': 'slow', 'fault:stall': 'stall' } as const)[String(jsonOf(req).note) as 'fault:reset'],
    execute: (req, n) => {
      const b = jsonOf(req)
      return {
        status: 200,
        headers: { 'square-version': '2026-09-16' },
        body: { payment: { id: `pay_${n}`, status: 'COMPLETED', amount_money: b.amount_money, reference_id: b.reference_id, source_type: 'CARD', created_at: '2026-12-03T10:00:00Z' } },
      }
    },
    reused: () => ({ status: 400, body: { errors: [{ category: 'INVALID_REQUEST_ERROR', code: 'IDEMPOTENCY_KEY_REUSED', detail: 'The idempotency key can only be retried with the same request data.' }] } }),
  })
}

describe.each(backends())('the official Square SDK through fencegate, on $name', (backend) => {
  let t: TestDb
  let fake: FakeApi
  let gw: TestGateway
  let square: SquareClient
  /** Every attempt the SDK made, by idempotency key (its retries included), seen by its own fetch. */
  const attempts = new Map<string, number>()
  const attemptsOf = (key: string) => attempts.get(key) ?? 0
  const onAttempt = new Set<(key: string) => void>()
  const counting: typeof fetch = (input, init) => {
    const key = String(JSON.parse(String(init?.body ?? '{}')).idempotency_key ?? '')
    attempts.set(key, attemptsOf(key) + 1)
    for (const f of onAttempt) f(key)
    return fetch(input, init)
  }

  beforeAll(async () => {
    t = await backend.open()
    fake = await startFakeSquare()
    gw = await startTestGateway({ config: testConfig(recipeRoutes('square', fake.upstream.url)), store: t.store })
    square = new SquareClient({ token: 'sq_test_fencegate', baseUrl: gw.url, fetch: counting })
  })
  afterAll(async () => {
    await gw?.close()
    await fake?.close()
    await t?.close()
  })

  const payment = (key: string, order: string, extra: Record<string, unknown> = {}) =>
    ({ idempotencyKey: key, sourceId: 'cnon:card-nonce-ok', amountMoney: { amount: BigInt(100), currency: 'USD' as const }, referenceId: order, ...extra })
  /** The error the SDK threw; fails the test if the call resolved. */
  const thrown = async <E>(call: Promise<unknown>, type: new (...args: never[]) => E): Promise<E> => {
    const outcome = await call.then((value) => ({ value }), (error: unknown) => ({ error }))
    if (!('error' in outcome)) throw new Error(`resolved as ${JSON.stringify(outcome.value, (_k, v) => (typeof v === 'bigint' ? String(v) : v))}`)
    expect(outcome.error).toBeInstanceOf(type)
    return outcome.error as E
  }

  it('creates a payment once; the retry with its key gets the replay, and the body reaches Square as the SDK wrote it', async () => {
    const first = await square.payments.create(payment('plain', 'o-plain'))
    const again = await square.payments.create(payment('plain', 'o-plain'))
    expect(first.payment).toMatchObject({ status: 'COMPLETED', referenceId: 'o-plain', sourceType: 'CARD' })
    expect(again.payment!.id).toBe(first.payment!.id)
    expect(fake.executions.get('plain')).toBe(1)
    expect(fake.arrivals('plain')).toBe(1)
    expect(jsonOf(fake.upstream.received.at(-1)!)).toMatchObject({ idempotency_key: 'plain', source_id: 'cnon:card-nonce-ok', reference_id: 'o-plain' })
  })

  it('a reset after Square processed the payment: the SDK retries the 502, fencegate forwards it, Square replays: one payment', async () => {
    const res = await square.payments.create(payment('reset', 'o-reset', { note: 'fault:reset' }))
    expect(res.payment).toMatchObject({ status: 'COMPLETED', referenceId: 'o-reset' })
    expect(fake.executions.get('reset')).toBe(1)
    expect(fake.arrivals('reset')).toBe(2)
    expect(attemptsOf('reset')).toBe(2)
  })

  it('Square slower than the SDK\'s timeout: the SDK throws its timeout, the call again with the key waits for the original and gets its payment', async () => {
    const release = (key: string) => {
      if (key === 'slow' && attemptsOf('slow') === 2) fake.releaseSlow()
    }
    onAttempt.add(release)
    // On Node's fetch the SDK's timeout rejects with its abort reason, the string "timeout",
    // which the SDK files as a SquareError without a status rather than a SquareTimeoutError.
    const timedOut = await thrown(square.payments.create(payment('slow', 'o-slow', { note: 'fault:slow' }), { timeoutInSeconds: 0.5 }), SquareError)
    expect(timedOut).not.toBeInstanceOf(SquareTimeoutError)
    expect([timedOut.statusCode, timedOut.message]).toEqual([undefined, '"timeout"'])
    const res = await square.payments.create(payment('slow', 'o-slow', { note: 'fault:slow' }))
    onAttempt.delete(release)
    expect(res.payment).toMatchObject({ status: 'COMPLETED', referenceId: 'o-slow' })
    expect(attemptsOf('slow')).toBe(2)
    expect(fake.executions.get('slow')).toBe(1)
    expect(fake.arrivals('slow')).toBe(1)
  })

  it('Square slower than the route\'s timeout_ms: the SDK retries the 504 with its key, fencegate forwards it, Square replays: one payment', async () => {
    // The recipe's route with a short timeout_ms, on a gateway of its own (the lock must outlast it, as it does).
    const quick = await startTestGateway({ config: testConfig(recipeRoutes('square', fake.upstream.url).map((r) => ({ ...r, timeout_ms: 300 }))), store: t.store })
    try {
      const client = new SquareClient({ token: 'sq_test_fencegate', baseUrl: quick.url, fetch: counting })
      const res = await client.payments.create(payment('stall', 'o-stall', { note: 'fault:stall' }))
      expect(res.payment).toMatchObject({ status: 'COMPLETED', referenceId: 'o-stall' })
      expect(attemptsOf('stall')).toBe(2)
      expect(fake.executions.get('stall')).toBe(1)
      expect(fake.arrivals('stall')).toBe(2)
    } finally {
      await quick.close()
    }
  })

  it('20 concurrent calls on 5 keys: 5 payments, and every caller gets its key\'s payment', async () => {
    fake.holdUntilNames(5)
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => square.payments.create(payment(`conc-${i % 5}`, `o-conc-${i % 5}`))))
    fake.holdUntilNames(0)
    for (let k = 0; k < 5; k++) {
      const mine = results.filter((_, i) => i % 5 === k)
      expect(new Set(mine.map((r) => r.payment!.id)).size).toBe(1)
      expect(mine[0]!.payment!.referenceId).toBe(`o-conc-${k}`)
      expect(fake.executions.get(`conc-${k}`)).toBe(1)
      expect(fake.arrivals(`conc-${k}`)).toBe(1)
    }
  })

  it('the same key with another amount: a thrown SquareError, not retried, never forwarded', async () => {
    await square.payments.create(payment('same', 'o-same'))
    const before = attemptsOf('same')
    const err = await thrown(square.payments.create(payment('same', 'o-same', { amountMoney: { amount: BigInt(200), currency: 'USD' } })), SquareError)
    expect(err.statusCode).toBe(422)
    expect(err.body).toMatchObject({ code: 'idempotency_key_reused', status: 422 })
    // Square's own errors[], from the recipe's error_envelope: square (Square's code for this refusal too).
    expect(err.errors).toEqual([{ category: 'INVALID_REQUEST_ERROR', code: 'IDEMPOTENCY_KEY_REUSED', detail: 'this Idempotency-Key was used with a different method, path, query or body' }])
    expect(attemptsOf('same')).toBe(before + 1)
    expect(fake.arrivals('same')).toBe(1)
  })

  it('a stale fence in the SDK\'s per-request headers: thrown once, never retried, never forwarded', async () => {
    await square.payments.create(payment('fence-5', 'o-fenced'), { headers: { 'X-Execution-Fence': '5' } })
    const err = await thrown(square.payments.create(payment('fence-4', 'o-fenced'), { headers: { 'X-Execution-Fence': '4' } }), SquareError)
    expect(err.statusCode).toBe(409)
    expect(err.body).toMatchObject({ code: 'stale_fence', detail: expect.stringMatching(/fence 4 is lower than 5/) })
    // Square's own errors[], from the recipe's error_envelope: square; the message is the SDK's, with the body.
    expect(err.errors).toEqual([{ category: 'INVALID_REQUEST_ERROR', code: 'STALE_FENCE', detail: 'fence 4 is lower than 5, the highest accepted for order:o-fenced' }])
    expect(err.message).toMatch(/^Status code: 409\nBody: \{/)
    expect(attemptsOf('fence-4')).toBe(1)
    expect(fake.arrivals('fence-4')).toBe(0)
    const audit = await (await fetch(`${gw.adminUrl}/audit?entity=order:o-fenced`)).json() as { items: { code: string }[] }
    expect(audit.items.filter((i) => i.code === 'stale_fence')).toHaveLength(1)
  })

  it('without the recipe\'s error_envelope line, errors[0] is the SDK\'s V1 fallback, made from the problem\'s type', async () => {
    const bare = await startTestGateway({ config: testConfig(recipeRoutes('square', fake.upstream.url).map(({ error_envelope: _, ...r }) => r)), store: t.store })
    try {
      const client = new SquareClient({ token: 'sq_test_fencegate', baseUrl: bare.url })
      await client.payments.create(payment('bare-5', 'o-bare'), { headers: { 'X-Execution-Fence': '5' } })
      const err = await thrown(client.payments.create(payment('bare-4', 'o-bare'), { headers: { 'X-Execution-Fence': '4' } }), SquareError)
      expect([err.statusCode, (err.body as { code: string }).code]).toEqual([409, 'stale_fence'])
      expect(err.errors).toEqual([{ category: 'V1_ERROR', code: 'urn:fencegate:problem:stale_fence', detail: undefined, field: undefined }])
    } finally {
      await bare.close()
    }
  })
})
