import { describe, expect, it } from 'vitest'
import { hasDuplicateKeys } from '../src/http/json-keys.js'
import { backends } from './helpers/backends.js'
import { sharedGateway } from './helpers/fresh-gateway.js'
import { post, rawPost, route, testConfig } from './helpers/gateway.js'
import { bearer, hmacAuthenticator, jwtAuth } from './helpers/tokens.js'

/**
 * Requests the gateway and an upstream could read differently, replayed as the review sent
 * them: each passed the tenant check or the freeze, or fenced another entity than the one an
 * upstream acts on, before. Now each is refused (400) and nothing is forwarded.
 */
describe('one reading of a request', () => {
  const fx = sharedGateway(backends()[0]!, async ({ upstream }) => ({
    config: testConfig([
      route(upstream.url, { name: 'tickets', path: '/tickets', entity: 'ticket:{body.ticket_id}', claimed_tenant: 'body.tenant_id' }),
      route(upstream.url, { name: 'lookup', path: '/lookup', entity: 'invoice:{query.id}' }),
      route(upstream.url, { name: 'notes', path: '/notes', entity: 'invoice:{body.invoice}', fence: 'optional' }),
      route(upstream.url, { name: 'accounts', path: '/accounts', entity: 'acct:{header.X-Account}', idempotency: 'required' }),
    ], { auth: jwtAuth, entity_rules: [{ name: 'hold', entity_match: 'invoice:42', frozen: true }] }),
    authenticate: await hmacAuthenticator(),
  }))

  const asTenantA = () => bearer({ tenant_id: 'A' })

  it('a JSON body declared as a form is refused: its strings hid form fields for another tenant and ticket', async () => {
    const body = '{"tenant_id":"B","ticket_id":"T1","x":"&tenant_id=A&ticket_id=T2&y="}'
    const res = await post(`${fx.gw.url}/tickets`, '1', { body, headers: { ...await asTenantA(), 'content-type': 'application/x-www-form-urlencoded' } })
    expect([res.status, res.json.code]).toEqual([400, 'invalid_request'])
    expect(res.json.detail).toContain('declared as a form but is JSON')
    expect(fx.upstream.received).toHaveLength(0)
  })

  it('a JSON key named twice is refused: the gateway read the last tenant, an upstream may read the first', async () => {
    for (const body of ['{"tenant_id":"B","ticket_id":"T1","tenant_id":"A"}', '{"tenant_id":"A","ticket_id":"T1","\\u0074enant_id":"B"}']) {
      const res = await post(`${fx.gw.url}/tickets`, '1', { body, headers: await asTenantA() })
      expect([res.status, res.json.code], body).toEqual([400, 'invalid_request'])
    }
    expect(fx.upstream.received).toHaveLength(0)
    // The same request with each key once is served.
    expect((await post(`${fx.gw.url}/tickets`, '1', { body: '{"tenant_id":"A","ticket_id":"T1"}', headers: await asTenantA() })).status).toBe(200)
  })

  it('a query parameter the entity reads, given twice, is refused', async () => {
    const res = await post(`${fx.gw.url}/lookup?id=1&id=2`, '1', { headers: await asTenantA() })
    expect([res.status, res.json.code]).toEqual([400, 'invalid_request'])
    expect((await post(`${fx.gw.url}/lookup?id=1&other=1&other=2`, '1', { headers: await asTenantA() })).status).toBe(200)
  })

  it('Connection cannot strip the Content-Type the gateway read the body with', async () => {
    const before = fx.upstream.received.length
    const res = await rawPost(`${fx.gw.url}/tickets`, { ...await asTenantA(), 'x-execution-fence': '2', 'content-type': 'application/x-www-form-urlencoded', connection: 'content-type' }, 'tenant_id=A&ticket_id=T3')
    expect(res.status).toBe(200)
    expect(fx.upstream.received[before]!.headers['content-type']).toBe('application/x-www-form-urlencoded')
  })

  it('on a fence: optional route, a command that names no entity is refused while an entity it could reach is frozen', async () => {
    const res = await post(`${fx.gw.url}/notes`, undefined, { body: '{"note":"for invoice 42, by another field"}', headers: await asTenantA() })
    expect([res.status, res.json.code]).toEqual([400, 'entity_unresolved'])
    expect(res.json.detail).toContain('rule hold')
    // An entity that resolves and is not frozen is served as before.
    expect((await post(`${fx.gw.url}/notes`, undefined, { body: '{"invoice":"7"}', headers: await asTenantA() })).status).toBe(200)
  })

  it('a key sent again with another entity header is a reused key: it replayed the other entity\'s answer', async () => {
    const headers = async (account: string) => ({ ...await asTenantA(), 'idempotency-key': 'acct-op-1', 'x-account': account })
    expect((await post(`${fx.gw.url}/accounts`, '5', { headers: await headers('A-1') })).status).toBe(200)
    const other = await post(`${fx.gw.url}/accounts`, '5', { headers: await headers('B-2') })
    expect([other.status, other.json.code]).toEqual([422, 'idempotency_key_reused'])
    expect((await post(`${fx.gw.url}/accounts`, '5', { headers: await headers('A-1') })).headers.get('idempotent-replayed')).toBe('true')
  })

  it.each([
    ['{"a":1,"a":2}', true], ['{"a":{"b":1},"b":{"b":2}}', false], ['[{"a":1},{"a":1}]', false],
    ['{"a":"\\"a\\":","b":1}', false], ['{"x":{"a":1,"a":1}}', true], ['{"k":"v","\\u006b":1}', true], ['{}', false],
  ])('hasDuplicateKeys(%s) is %s', (text, duplicate) => {
    expect(hasDuplicateKeys(text)).toBe(duplicate)
  })
})
