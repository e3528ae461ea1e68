import { CheckoutAPI, Client, EnvironmentEnum, HttpClientException, HttpURLConnectionClient, Types } from '@adyen/api-library'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { jsonOf, recipeRoutes, startFakeApi, type FakeApi } from './helpers/fake-api.js'
import { startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { makeCertificates, startTlsFront, type TlsFront } from './helpers/tls-front.js'

/**
 * An Adyen-like upstream: `POST /v72/payments` answering a `PaymentResponse`, Adyen's own
 * de-duplication by `Idempotency-Key` (the same payload replays, another is Adyen's
 * `422` error object), and a `shopperReference` of `fault:reset`, `fault:slow` or `fault:stall`.
 */
function startFakeAdyen(): Promise<FakeApi> {
  return startFakeApi({
    keyOf: (req) => (req.headers['idempotency-key'] as string | undefined),
    faultOf: (req) => ({ 'fault:reset': 'reset', 'fault:slow': 'slow', 'fault:stall': 'stall' } as const)[String(jsonOf(req).shopperReference) as 'fault:reset'],
    execute: (req, n) => {
      const b = jsonOf(req)
      const psp = `PSP${String(n).padStart(13, '0')}`
      return { status: 200, headers: { pspreference: psp }, body: { pspReference: psp, resultCode: 'Authorised', merchantReference: b.reference, amount: b.amount } }
    },
    reused: () => ({ status: 422, body: { status: 422, errorCode: '704', message: 'request already processed or in progress', errorType: 'validation' } }),
  })
}

describe.each(backends())('the official Adyen library through fencegate, on $name', (backend) => {
  let t: TestDb
  let fake: FakeApi
  let gw: TestGateway
  let front: TlsFront
  /** The recipe's client: the library's own HTTP client, with Adyen's URLs sent to fencegate's TLS front. */
  const checkoutVia = (config: { connectionTimeoutMillis?: number } = {}, via = front.url) => {
    const adyenHttp = new HttpURLConnectionClient()
    // The recipe trusts the front with NODE_EXTRA_CA_CERTS; a test process already running gives the CA to the library's agent.
    Object.assign(adyenHttp, { agentOptions: { ca: certs.ca } })
    const client = new Client({ apiKey: 'AQE_test_fencegate', environment: EnvironmentEnum.TEST, ...config })
    client.httpClient = {
      request: (endpoint, json, cfg, isApiKeyRequired, options) =>
        adyenHttp.request(endpoint.replace('https://checkout-test.adyen.com', via), json, cfg, isApiKeyRequired, options),
    }
    return new CheckoutAPI(client)
  }
  const certs = makeCertificates()
  let checkout: CheckoutAPI

  beforeAll(async () => {
    t = await backend.open()
    fake = await startFakeAdyen()
    gw = await startTestGateway({ config: testConfig(recipeRoutes('adyen', fake.upstream.url)), store: t.store })
    front = await startTlsFront(certs, Number(new URL(gw.url).port))
    checkout = checkoutVia()
  })
  afterAll(async () => {
    await front?.close()
    await gw?.close()
    await fake?.close()
    await t?.close()
  })

  const payment = (reference: string, extra: Partial<Types.checkout.PaymentRequest> = {}): Types.checkout.PaymentRequest => ({
    merchantAccount: 'ShopCOM', reference, amount: { currency: 'EUR', value: 1000 }, returnUrl: 'https://shop.example/return',
    paymentMethod: { type: Types.checkout.CardDetails.TypeEnum.Scheme, encryptedCardNumber: 'test_4111111111111111' }, ...extra,
  })
  const thrown = async <E>(call: Promise<unknown>, type: abstract new (...args: never[]) => E): Promise<E> => {
    const outcome = await call.then((value) => ({ value }), (error: unknown) => ({ error }))
    if (!('error' in outcome)) throw new Error(`resolved as ${JSON.stringify(outcome.value)}`)
    expect(outcome.error).toBeInstanceOf(type)
    return outcome.error as E
  }

  it('pays once; the retry with its key gets the replay, through a TLS front, with the library\'s own HTTP client', async () => {
    const first = await checkout.PaymentsApi.payments(payment('o-plain'), { idempotencyKey: 'plain' })
    const again = await checkout.PaymentsApi.payments(payment('o-plain'), { idempotencyKey: 'plain' })
    expect(first).toMatchObject({ resultCode: 'Authorised', merchantReference: 'o-plain' })
    expect(again.pspReference).toBe(first.pspReference)
    expect(fake.executions.get('plain')).toBe(1)
    expect(fake.arrivals('plain')).toBe(1)
    expect(fake.upstream.received.at(-1)!.headers['x-api-key']).toBe('AQE_test_fencegate')
  })

  it('a reset after Adyen authorised: the library throws the 502, the call again with the key is forwarded and replayed: one payment', async () => {
    const lost = await thrown(checkout.PaymentsApi.payments(payment('o-reset', { shopperReference: 'fault:reset' }), { idempotencyKey: 'reset' }), HttpClientException)
    expect(lost.statusCode).toBe(502)
    expect(lost.apiError).toMatchObject({ code: 'upstream_unreachable' })
    expect([lost.errorCode, lost.apiError!.errorType]).toEqual(['upstream_unreachable', 'internal'])
    const again = await checkout.PaymentsApi.payments(payment('o-reset', { shopperReference: 'fault:reset' }), { idempotencyKey: 'reset' })
    expect(again).toMatchObject({ resultCode: 'Authorised', merchantReference: 'o-reset' })
    expect(fake.executions.get('reset')).toBe(1)
    expect(fake.arrivals('reset')).toBe(2)
  })

  it('Adyen slower than connectionTimeoutMillis: the library throws, the call again with the key gets the one payment', async () => {
    const impatient = checkoutVia({ connectionTimeoutMillis: 300 })
    // The library rejects a lost connection with its ApiException, which is not an Error (nor exported).
    const gaveUp = await thrown(impatient.PaymentsApi.payments(payment('o-slow', { shopperReference: 'fault:slow' }), { idempotencyKey: 'slow' }), Object)
    expect(gaveUp).toMatchObject({ name: 'ApiException', message: 'socket hang up', statusCode: 500 })
    const again = checkout.PaymentsApi.payments(payment('o-slow', { shopperReference: 'fault:slow' }), { idempotencyKey: 'slow' })
    fake.releaseSlow()
    expect(await again).toMatchObject({ resultCode: 'Authorised', merchantReference: 'o-slow' })
    expect(fake.executions.get('slow')).toBe(1)
    expect(fake.arrivals('slow')).toBe(1)
  })

  it('Adyen slower than the route\'s timeout_ms: the library throws the 504, the call again with the key is forwarded and replayed: one payment', async () => {
    const quick = await startTestGateway({ config: testConfig(recipeRoutes('adyen', fake.upstream.url).map((r) => ({ ...r, timeout_ms: 300 }))), store: t.store })
    const quickFront = await startTlsFront(certs, Number(new URL(quick.url).port))
    try {
      const via = checkoutVia({}, quickFront.url)
      const late = await thrown(via.PaymentsApi.payments(payment('o-stall', { shopperReference: 'fault:stall' }), { idempotencyKey: 'stall' }), HttpClientException)
      expect(late.statusCode).toBe(504)
      expect(late.apiError).toMatchObject({ code: 'upstream_timeout' })
      expect([late.errorCode, late.apiError!.errorType]).toEqual(['upstream_timeout', 'internal'])
      const again = await via.PaymentsApi.payments(payment('o-stall', { shopperReference: 'fault:stall' }), { idempotencyKey: 'stall' })
      expect(again).toMatchObject({ resultCode: 'Authorised', merchantReference: 'o-stall' })
      expect(fake.executions.get('stall')).toBe(1)
      expect(fake.arrivals('stall')).toBe(2)
    } finally {
      await quickFront.close()
      await quick.close()
    }
  })

  it('a payment without idempotencyKey is refused on this route, never forwarded', async () => {
    const before = fake.upstream.received.length
    const err = await thrown(checkout.PaymentsApi.payments(payment('o-nokey')), HttpClientException)
    expect(err.statusCode).toBe(400)
    expect(err.apiError).toMatchObject({ code: 'idempotency_key_required' })
    expect([err.errorCode, err.message]).toEqual(['idempotency_key_required', 'HTTP Exception: 400. Bad Request: route adyen-payments requires Idempotency-Key'])
    expect(fake.upstream.received).toHaveLength(before)
  })

  it('20 concurrent payments on 5 keys: 5 payments, and every caller gets its key\'s pspReference', async () => {
    fake.holdUntilNames(5)
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => checkout.PaymentsApi.payments(payment(`o-conc-${i % 5}`), { idempotencyKey: `conc-${i % 5}` })))
    fake.holdUntilNames(0)
    for (let k = 0; k < 5; k++) {
      const mine = results.filter((_, i) => i % 5 === k)
      expect(new Set(mine.map((r) => r.pspReference)).size).toBe(1)
      expect(mine[0]!.merchantReference).toBe(`o-conc-${k}`)
      expect(fake.executions.get(`conc-${k}`)).toBe(1)
      expect(fake.arrivals(`conc-${k}`)).toBe(1)
    }
  })

  it('the same key with another amount: thrown, never forwarded', async () => {
    await checkout.PaymentsApi.payments(payment('o-same'), { idempotencyKey: 'same' })
    const err = await thrown(checkout.PaymentsApi.payments(payment('o-same', { amount: { currency: 'EUR', value: 2000 } }), { idempotencyKey: 'same' }), HttpClientException)
    expect(err.statusCode).toBe(422)
    expect(err.apiError).toMatchObject({ code: 'idempotency_key_reused', errorType: 'validation' })
    expect([err.errorCode, err.message]).toEqual(['idempotency_key_reused', 'HTTP Exception: 422. Unprocessable Entity: this Idempotency-Key was used with a different method, path, query or body'])
    expect(fake.arrivals('same')).toBe(1)
  })

  it('a stale fence in the request headers: thrown once, never forwarded, one audit row', async () => {
    await checkout.PaymentsApi.payments(payment('o-fenced'), { idempotencyKey: 'fence-5', headers: { 'X-Execution-Fence': '5' } })
    const err = await thrown(checkout.PaymentsApi.payments(payment('o-fenced'), { idempotencyKey: 'fence-4', headers: { 'X-Execution-Fence': '4' } }), HttpClientException)
    expect(err.statusCode).toBe(409)
    expect(err.apiError).toMatchObject({ code: 'stale_fence', detail: expect.stringMatching(/fence 4 is lower than 5/) })
    // Adyen's own fields, from the recipe's error_envelope: adyen.
    const detail = 'fence 4 is lower than 5, the highest accepted for payment:o-fenced'
    expect([err.errorCode, err.message]).toEqual(['stale_fence', `HTTP Exception: 409. Conflict: ${detail}`])
    expect(err.apiError).toMatchObject({ status: 409, errorCode: 'stale_fence', message: detail, errorType: 'validation' })
    expect(fake.arrivals('fence-4')).toBe(0)
    const audit = await (await fetch(`${gw.adminUrl}/audit?entity=payment:o-fenced`)).json() as { items: { code: string }[] }
    expect(audit.items.filter((i) => i.code === 'stale_fence')).toHaveLength(1)
  })

  it('without the recipe\'s error_envelope line, errorCode is undefined and the message ends in undefined', async () => {
    const bare = await startTestGateway({ config: testConfig(recipeRoutes('adyen', fake.upstream.url).map(({ error_envelope: _, ...r }) => r)), store: t.store })
    const bareFront = await startTlsFront(certs, Number(new URL(bare.url).port))
    try {
      const via = checkoutVia({}, bareFront.url)
      await via.PaymentsApi.payments(payment('o-bare'), { idempotencyKey: 'bare-5', headers: { 'X-Execution-Fence': '5' } })
      const err = await thrown(via.PaymentsApi.payments(payment('o-bare'), { idempotencyKey: 'bare-4', headers: { 'X-Execution-Fence': '4' } }), HttpClientException)
      expect(err.apiError).toMatchObject({ code: 'stale_fence' })
      expect([err.errorCode, err.message]).toEqual([undefined, 'HTTP Exception: 409. Conflict: undefined'])
    } finally {
      await bareFront.close()
      await bare.close()
    }
  })
})
