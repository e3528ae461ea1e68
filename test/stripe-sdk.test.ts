import { readFileSync } from 'node:fs'
import Stripe from 'stripe'
import { parse } from 'yaml'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { startFakeStripe, type FakeStripe } from './helpers/fake-stripe.js'
import { startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'

/** The route of docs/recipes/stripe.md, read from its YAML, pointed at the fake instead of api.stripe.com. */
function recipeRoute(): Record<string, unknown> {
  const doc = readFileSync(new URL('../docs/recipes/stripe.md', import.meta.url), 'utf8')
  const yaml = /```yaml\n([\s\S]*?)```/.exec(doc)![1]!
  return (parse(yaml) as { routes: Record<string, unknown>[] }).routes[0]!
}
const paymentIntents = (upstream: string) => ({ ...recipeRoute(), upstream })
/** The same without trusting the upstream to de-duplicate keys: an unknown outcome is an operator's call. */
const charges = (upstream: string) => ({ ...paymentIntents(upstream), name: 'charges', path: '/v1/charges', upstream_dedupes_keys: false })

describe.each(backends())('the official Stripe SDK through fencegate, on $name', (backend) => {
  let t: TestDb
  let fake: FakeStripe
  let gw: TestGateway
  let stripe: Stripe
  /** Every attempt the SDK made, by idempotency key (its retries included). */
  const attempts = new Map<string, number>()
  const attemptsOf = (key: string) => attempts.get(key) ?? 0
  const onAttempt = new Set<(key: string) => void>()

  beforeAll(async () => {
    t = await backend.open()
    fake = await startFakeStripe()
    gw = await startTestGateway({ config: testConfig([paymentIntents(fake.upstream.url), charges(fake.upstream.url)]), store: t.store })
    stripe = new Stripe('sk_test_fencegate', { host: '127.0.0.1', port: Number(new URL(gw.url).port), protocol: 'http', maxNetworkRetries: 2, telemetry: false })
    stripe.on('request', (e: { idempotency_key?: string }) => {
      const key = e.idempotency_key ?? ''
      attempts.set(key, attemptsOf(key) + 1)
      for (const f of onAttempt) f(key)
    })
  })
  afterAll(async () => {
    await gw?.close()
    await fake?.close()
    await t?.close()
  })

  const intent = (customer: string, extra: Record<string, unknown> = {}) =>
    ({ amount: 1000, currency: 'usd', metadata: { external_id: customer }, ...extra }) as Stripe.PaymentIntentCreateParams
  /** The error the SDK threw; fails the test if the call resolved. */
  const thrown = async (call: Promise<unknown>): Promise<Stripe.errors.StripeError> => {
    const outcome = await call.then((value) => ({ value }), (error: unknown) => ({ error }))
    if (!('error' in outcome)) throw new Error(`resolved as ${JSON.stringify(outcome.value)}`)
    expect(outcome.error).toBeInstanceOf(Stripe.errors.StripeError)
    return outcome.error as Stripe.errors.StripeError
  }

  it('creates a PaymentIntent once; the retry with its key gets the replay, with Stripe\'s request id and the key', async () => {
    const first = await stripe.paymentIntents.create(intent('c_plain'), { idempotencyKey: 'plain' })
    const again = await stripe.paymentIntents.create(intent('c_plain'), { idempotencyKey: 'plain' })
    expect(first).toMatchObject({ object: 'payment_intent', status: 'succeeded', amount: 1000 })
    expect(again.id).toBe(first.id)
    expect(again.lastResponse.requestId).toBe(first.lastResponse.requestId)
    expect(again.lastResponse.requestId).toMatch(/^req_/)
    expect(again.lastResponse.apiVersion).toBe('2025-01-27.acacia')
    expect(again.lastResponse.idempotencyKey).toBe('plain')
    expect(again.lastResponse.headers['idempotent-replayed']).toBe('true')
    expect(fake.executions.get('plain')).toBe(1)
    expect(fake.arrivals('plain')).toBe(1)
  })

  it('a reset after the upstream processed the call: the SDK retries, the upstream recognises the key, one charge', async () => {
    const pi = await stripe.paymentIntents.create(intent('c_reset', { metadata: { external_id: 'c_reset', fault: 'reset' } }), { idempotencyKey: 'reset' })
    expect(pi.status).toBe('succeeded')
    expect(fake.executions.get('reset')).toBe(1)
    // The first attempt was lost on the way back; the retry was forwarded with the same key.
    expect(fake.arrivals('reset')).toBe(2)
    expect(attemptsOf('reset')).toBe(2)
  })

  it('a reset where the upstream is not trusted to de-duplicate: a thrown StripeAPIError, not retried, and the next call learns the outcome is unknown', async () => {
    const params = { amount: 500, currency: 'usd', metadata: { external_id: 'c_lost', fault: 'reset' } }
    const lost = await thrown(stripe.charges.create(params, { idempotencyKey: 'lost' }))
    expect(lost).toBeInstanceOf(Stripe.errors.StripeAPIError)
    expect(lost).toMatchObject({ code: 'upstream_unreachable', rawType: 'api_error', statusCode: 502 })
    expect(attemptsOf('lost')).toBe(1)
    const again = await thrown(stripe.charges.create(params, { idempotencyKey: 'lost' }))
    expect(again).toMatchObject({ code: 'outcome_unknown', rawType: 'api_error', statusCode: 502 })
    expect(again.message).toMatch(/answer was lost/)
    expect(attemptsOf('lost')).toBe(2)
    expect(fake.executions.get('lost')).toBe(1)
    expect(fake.arrivals('lost')).toBe(1)
  })

  it('an upstream slower than the SDK\'s timeout: the SDK\'s retry waits for the original and gets its result', async () => {
    // The upstream answers only once the SDK has given up on its first attempt and sent a retry.
    const release = (key: string) => {
      if (key === 'slow' && attemptsOf('slow') === 2) fake.releaseSlow()
    }
    onAttempt.add(release)
    const pi = await stripe.paymentIntents.create(intent('c_slow', { metadata: { external_id: 'c_slow', fault: 'slow' } }), { idempotencyKey: 'slow', timeout: 1000, maxNetworkRetries: 5 })
    onAttempt.delete(release)
    expect(pi.status).toBe('succeeded')
    expect(attemptsOf('slow')).toBeGreaterThanOrEqual(2)
    expect(fake.executions.get('slow')).toBe(1)
  })

  it('50 concurrent calls on 10 keys: one execution per key, and every caller gets that key\'s PaymentIntent', async () => {
    fake.holdUntilKeys(10)
    const calls = Array.from({ length: 50 }, (_, i) => {
      const n = i % 10
      return stripe.paymentIntents.create(intent(`c_conc_${n}`, { amount: 100 + n }), { idempotencyKey: `conc-${n}` })
    })
    const results = await Promise.all(calls)
    fake.holdUntilKeys(0)
    for (let n = 0; n < 10; n++) {
      const mine = results.filter((_, i) => i % 10 === n)
      expect(new Set(mine.map((pi) => pi.id)).size).toBe(1)
      expect(mine[0]!.amount).toBe(100 + n)
      expect(fake.executions.get(`conc-${n}`)).toBe(1)
      expect(fake.arrivals(`conc-${n}`)).toBe(1)
    }
  })

  it('the same key with other parameters: a thrown idempotency error, not retried, nothing forwarded', async () => {
    await stripe.paymentIntents.create(intent('c_same'), { idempotencyKey: 'same' })
    const before = attemptsOf('same')
    const err = await thrown(stripe.paymentIntents.create(intent('c_same', { amount: 2000 }), { idempotencyKey: 'same' }))
    expect(err).toBeInstanceOf(Stripe.errors.StripeAPIError)
    expect(err).toMatchObject({ code: 'idempotency_key_reused', rawType: 'idempotency_error', statusCode: 422 })
    expect(err.headers?.['stripe-should-retry']).toBe('false')
    expect(attemptsOf('same')).toBe(before + 1)
    expect(fake.arrivals('same')).toBe(1)
  })

  it('a stale fence sent through the SDK\'s per-request headers: thrown once, never retried, never forwarded', async () => {
    await stripe.paymentIntents.create(intent('c_fenced'), { idempotencyKey: 'fence-5', headers: { 'X-Execution-Fence': '5' } })
    const err = await thrown(stripe.paymentIntents.create(intent('c_fenced'), { idempotencyKey: 'fence-4', headers: { 'X-Execution-Fence': '4' } }))
    expect(err).toBeInstanceOf(Stripe.errors.StripeAPIError)
    expect(err).toMatchObject({ code: 'stale_fence', rawType: 'invalid_request_error', statusCode: 409 })
    expect(err.message).toMatch(/fence 4 is lower than 5/)
    expect(err.requestId).toBeUndefined() // Stripe's Request-Id is the upstream's; fencegate's id is X-Request-Id
    expect(err.headers?.['x-request-id']).toMatch(/.+/)
    expect(attemptsOf('fence-4')).toBe(1)
    expect(fake.arrivals('fence-4')).toBe(0)
    const audit = await (await fetch(`${gw.adminUrl}/audit?entity=customer:c_fenced`)).json() as { items: { code: string }[] }
    expect(audit.items.filter((i) => i.code === 'stale_fence')).toHaveLength(1)
  })

  it('client mistakes at status 400 and 404 raise StripeInvalidRequestError, not retried', async () => {
    const bad = await thrown(stripe.paymentIntents.create(intent('c_bad'), { idempotencyKey: 'bad-fence', headers: { 'X-Execution-Fence': '0x10' } }))
    expect(bad).toBeInstanceOf(Stripe.errors.StripeInvalidRequestError)
    expect(bad).toMatchObject({ code: 'invalid_fence', rawType: 'invalid_request_error', statusCode: 400 })
    const missing = await thrown(stripe.paymentIntents.create({ amount: 1, currency: 'usd' }, { idempotencyKey: 'no-customer', headers: { 'X-Execution-Fence': '1' } }))
    expect(missing).toBeInstanceOf(Stripe.errors.StripeInvalidRequestError)
    expect(missing).toMatchObject({ code: 'entity_unresolved', statusCode: 400 })
    const nowhere = await thrown(stripe.customers.create({ email: 'a@example.com' }, { idempotencyKey: 'no-route' }))
    expect(nowhere).toBeInstanceOf(Stripe.errors.StripeInvalidRequestError)
    expect(nowhere).toMatchObject({ code: 'no_route', statusCode: 404 })
    expect([attemptsOf('bad-fence'), attemptsOf('no-customer'), attemptsOf('no-route')]).toEqual([1, 1, 1])
  })
})
