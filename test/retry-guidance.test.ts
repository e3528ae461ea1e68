import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { gate, startUpstream, type TestUpstream } from './helpers/upstream.js'

const hint = 'stripe-should-retry'
const keyed = (key: string, fence = '1') => ({ headers: { 'idempotency-key': key, 'x-execution-fence': fence } })
const sdkRoute = (upstream: string, extra: Record<string, unknown> = {}) => route(upstream, {
  idempotency: 'required', retry_hint_header: 'Stripe-Should-Retry', replay_headers: ['Request-Id', 'Stripe-Version'], ...extra,
})

describe.each(backends())('retry guidance and what SDKs read, on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway
  let charges = 0

  beforeEach(async () => {
    t = await backend.open()
    charges = 0
    upstream = await startUpstream((_req, res) => {
      charges++
      res.writeHead(200, { 'content-type': 'application/json', 'request-id': `req_${charges}`, 'stripe-version': '2025-01-01' })
      res.end(JSON.stringify({ id: `ch_${charges}` }))
    })
  })
  afterEach(async () => {
    await gw?.close()
    await upstream.close()
    await t.close()
  })
  const start = async (routes: Record<string, unknown>[]) => {
    gw = await startTestGateway({ config: testConfig(routes), store: t.store })
  }
  const capture = () => `${gw.url}/payments/42/capture`

  it('tells a duplicate of a call in flight to come back when the call times out, not when its lock ends', async () => {
    const { opened, open } = gate()
    upstream.handle(async (_req, res) => {
      await opened
      res.writeHead(200, { 'content-type': 'application/json', 'request-id': 'req_slow' })
      res.end('{"id":"ch_slow"}')
    })
    await start([sdkRoute(upstream.url, { timeout_ms: 3000, idempotency_lock: '60s', idempotency_wait: 0 })])
    const original = post(capture(), '1', keyed('slow'))
    await upstream.arrived(1)
    const duplicate = await post(capture(), '1', keyed('slow'))
    expect(duplicate.json.code).toBe('request_in_progress')
    // The lock has about 60 s left; the original's timeout at most 3 s.
    expect(Number(duplicate.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    expect(Number(duplicate.headers.get('retry-after'))).toBeLessThanOrEqual(3)
    expect(duplicate.headers.get(hint)).toBe('true')
    expect(duplicate.headers.get('idempotency-key')).toBe('slow')
    open()
    expect((await original).json).toEqual({ id: 'ch_slow' })
  })

  it('replays the route\'s replay_headers, echoes Idempotency-Key on every answer, and says a replay is final', async () => {
    await start([sdkRoute(upstream.url)])
    const first = await post(capture(), '1', keyed('k1'))
    const replay = await post(capture(), '1', keyed('k1'))
    expect(first.headers.get('idempotency-key')).toBe('k1')
    expect(first.headers.get(hint)).toBeNull()
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect(replay.headers.get('request-id')).toBe('req_1')
    expect(replay.headers.get('stripe-version')).toBe('2025-01-01')
    expect(replay.headers.get('idempotency-key')).toBe('k1')
    expect(replay.headers.get(hint)).toBe('false')
    expect(replay.text).toBe(first.text)
    // An sf-string key is echoed as sent.
    expect((await post(capture(), '1', keyed('"k2"'))).headers.get('idempotency-key')).toBe('"k2"')
    expect(charges).toBe(2)
  })

  it('gives permanent refusals neither Retry-After nor a true hint', async () => {
    await start([sdkRoute(upstream.url)])
    await post(capture(), '5', keyed('a'))
    const stale = await post(capture(), '4', keyed('b'))
    const reused = await post(capture(), '5', { ...keyed('a'), body: '{"amount":2}' })
    for (const [answer, code] of [[stale, 'stale_fence'], [reused, 'idempotency_key_reused']] as const) {
      expect(answer.json.code).toBe(code)
      expect(answer.headers.get('retry-after')).toBeNull()
      expect(answer.headers.get(hint)).toBe('false')
    }
    expect(stale.headers.get('idempotency-key')).toBe('b')
  })

  it('without upstream_dedupes_keys, a reset after processing is permanent: the retry gets outcome_unknown', async () => {
    upstream.handle((_req, res) => {
      charges++
      res.socket?.destroy()
    })
    await start([sdkRoute(upstream.url)])
    const lost = await post(capture(), '1', keyed('reset'))
    expect(lost.json.code).toBe('upstream_unreachable')
    expect(lost.headers.get('retry-after')).toBeNull()
    expect(lost.headers.get(hint)).toBe('false')
    const again = await post(capture(), '1', keyed('reset'))
    expect(again.json.code).toBe('outcome_unknown')
    expect(again.headers.get('retry-after')).toBeNull()
    expect(again.headers.get(hint)).toBe('false')
    expect(charges).toBe(1)
  })

  it('with upstream_dedupes_keys, a reset or timeout is transient and the retry goes upstream with the same key', async () => {
    let first = true
    upstream.handle((req, res) => {
      if (req.path.includes('/43/')) return // never answers: a timeout
      if (first) {
        first = false
        res.socket?.destroy()
        return
      }
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"id":"ch_deduped"}')
    })
    await start([sdkRoute(upstream.url, { upstream_dedupes_keys: true, timeout_ms: 300, idempotency_lock: '5s' })])
    const lost = await post(capture(), '1', keyed('dd'))
    expect(lost.json.code).toBe('upstream_unreachable')
    expect(Number(lost.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    expect(lost.headers.get(hint)).toBe('true')
    const retried = await post(capture(), '1', keyed('dd'))
    expect(retried.json).toEqual({ id: 'ch_deduped' })
    expect(upstream.received.map((r) => r.headers['idempotency-key'])).toEqual(['dd', 'dd'])
    const timedOut = await post(`${gw.url}/payments/43/capture`, '1', keyed('slow-dd'))
    expect(timedOut.json.code).toBe('upstream_timeout')
    expect(timedOut.headers.get(hint)).toBe('true')
    expect(timedOut.headers.has('retry-after')).toBe(true)
  })

  it('without a key, a timeout is permanent: a retry could execute twice', async () => {
    upstream.handle(() => {})
    await start([route(upstream.url, { retry_hint_header: 'Stripe-Should-Retry', timeout_ms: 200 })])
    const timedOut = await post(capture(), '1')
    expect(timedOut.json.code).toBe('upstream_timeout')
    expect(timedOut.headers.get('retry-after')).toBeNull()
    expect(timedOut.headers.get(hint)).toBe('false')
  })
})
