import { describe, expect, it } from 'vitest'
import { backends } from './helpers/backends.js'
import { sharedGateway } from './helpers/fresh-gateway.js'
import { post, route, testConfig } from './helpers/gateway.js'
import { bearer, hmacAuthenticator, jwtAuth } from './helpers/tokens.js'

/**
 * Keys are scoped (tenant, key) inside fencegate, but an upstream whose one credential
 * serves every tenant (Stripe with `upstream_dedupes_keys`) sees only the key: tenant B
 * using A's key got A's idempotency errors or A's stored answer there.
 * `upstream_key: tenant_scoped` sends one key per tenant and key instead.
 */
describe('the Idempotency-Key the upstream gets', () => {
  const keyed = { idempotency: 'required', upstream_dedupes_keys: true }
  const fx = sharedGateway(backends()[0]!, async ({ upstream }) => ({
    config: testConfig([
      route(upstream.url, { ...keyed, upstream_key: 'tenant_scoped' }),
      route(upstream.url, { ...keyed, name: 'raw', path: '/raw/:invoice_id' }),
    ], { auth: jwtAuth }),
    authenticate: await hmacAuthenticator(),
  }))

  it('tenant_scoped: two tenants with the same key are two operations upstream, and a retry keeps its upstream key', async () => {
    const send = async (tenant: string, fence: string) => post(`${fx.gw.url}/payments/1/capture`, fence, { headers: { ...await bearer({ tenant_id: tenant }), 'idempotency-key': 'order-1' } })
    expect((await send('A', '1')).status).toBe(200)
    expect((await send('B', '1')).status).toBe(200)
    const [a, b] = fx.upstream.received.map((r) => String(r.headers['idempotency-key']))
    expect(a).toMatch(/^fg1-[0-9a-f]{64}$/)
    expect(b).toMatch(/^fg1-[0-9a-f]{64}$/)
    expect(a).not.toBe(b)
    expect(JSON.stringify(fx.upstream.received.map((r) => r.headers))).not.toContain('order-1')
    // A's duplicate is a replay; a new route of A's with another key gets another upstream key.
    expect((await send('A', '1')).headers.get('idempotent-replayed')).toBe('true')
    expect(fx.upstream.received).toHaveLength(2)
  })

  it('as_sent (the default): the client\'s key goes upstream unchanged', async () => {
    await post(`${fx.gw.url}/raw/1`, '1', { headers: { ...await bearer({ tenant_id: 'A' }), 'idempotency-key': 'order-2' } })
    expect(fx.upstream.received.at(-1)!.headers['idempotency-key']).toBe('order-2')
  })
})
