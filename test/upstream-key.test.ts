import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { bearer, hmacAuthenticator, jwtAuth } from './helpers/tokens.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * Keys are scoped (tenant, key) inside fencegate, but an upstream whose one credential
 * serves every tenant (Stripe with `upstream_dedupes_keys`) sees only the key: tenant B
 * using A's key got A's idempotency errors or A's stored answer there.
 * `upstream_key: tenant_scoped` sends one key per tenant and key instead.
 */
describe('the Idempotency-Key the upstream gets', () => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway

  beforeAll(async () => {
    t = await backends()[0]!.open()
    upstream = await startUpstream()
    const keyed = { idempotency: 'required', upstream_dedupes_keys: true }
    gw = await startTestGateway({
      config: testConfig([
        route(upstream.url, { ...keyed, upstream_key: 'tenant_scoped' }),
        route(upstream.url, { ...keyed, name: 'raw', path: '/raw/:invoice_id' }),
      ], { auth: jwtAuth }),
      store: t.store, authenticate: await hmacAuthenticator(),
    })
  })
  afterAll(async () => {
    await gw.close()
    await upstream.close()
    await t.close()
  })

  it('tenant_scoped: two tenants with the same key are two operations upstream, and a retry keeps its upstream key', async () => {
    const send = async (tenant: string, fence: string) => post(`${gw.url}/payments/1/capture`, fence, { headers: { ...await bearer({ tenant_id: tenant }), 'idempotency-key': 'order-1' } })
    expect((await send('A', '1')).status).toBe(200)
    expect((await send('B', '1')).status).toBe(200)
    const [a, b] = upstream.received.map((r) => String(r.headers['idempotency-key']))
    expect(a).toMatch(/^fg1-[0-9a-f]{64}$/)
    expect(b).toMatch(/^fg1-[0-9a-f]{64}$/)
    expect(a).not.toBe(b)
    expect(JSON.stringify(upstream.received.map((r) => r.headers))).not.toContain('order-1')
    // A's duplicate is a replay; a new route of A's with another key gets another upstream key.
    expect((await send('A', '1')).headers.get('idempotent-replayed')).toBe('true')
    expect(upstream.received).toHaveLength(2)
  })

  it('as_sent (the default): the client\'s key goes upstream unchanged', async () => {
    await post(`${gw.url}/raw/1`, '1', { headers: { ...await bearer({ tenant_id: 'A' }), 'idempotency-key': 'order-2' } })
    expect(upstream.received.at(-1)!.headers['idempotency-key']).toBe('order-2')
  })
})
