import { describe, expect, it } from 'vitest'
import { scanJson } from '../src/http/json-reading.js'
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
      route(upstream.url, { name: 'orders', path: '/orders', entity: undefined, fence: 'off', idempotency: 'required', idempotency_key: '{header.PayPal-Request-Id}', upstream_dedupes_keys: true }),
      route(upstream.url, { name: 'transfers', path: '/transfers/:id', entity: 'transfer:{params.id}', claimed_tenant: 'body.tenant_id' }),
      route(upstream.url, { name: 'members', path: '/members', entity: undefined, fence: 'off', claimed_tenant: 'header.X-Tenant' }),
    ], { auth: jwtAuth, entity_rules: [{ name: 'hold', entity_match: 'invoice:42', frozen: true }] }),
    authenticate: await hmacAuthenticator(),
  }))

  const asTenantA = () => bearer({ tenant_id: 'A' })

  it('a JSON body declared as a form is refused: its strings hid form fields for another tenant and ticket', async () => {
    const body = '{"tenant_id":"B","ticket_id":"T1","x":"&tenant_id=A&ticket_id=T2&y="}'
    const res = await post(`${fx.gw.url}/tickets`, '1', { body, headers: { ...await asTenantA(), 'content-type': 'application/x-www-form-urlencoded' } })
    expect([res.status, res.json.code]).toEqual([400, 'unreadable_body'])
    expect(res.json.detail).toContain('declared as a form but is JSON')
    expect(fx.upstream.received).toHaveLength(0)
  })

  it('a JSON key named twice is refused: the gateway read the last tenant, an upstream may read the first', async () => {
    for (const body of ['{"tenant_id":"B","ticket_id":"T1","tenant_id":"A"}', '{"tenant_id":"A","ticket_id":"T1","\\u0074enant_id":"B"}']) {
      const res = await post(`${fx.gw.url}/tickets`, '1', { body, headers: await asTenantA() })
      expect([res.status, res.json.code], body).toEqual([400, 'unreadable_body'])
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

  it('Connection cannot strip the idempotency key the upstream dedupes on: a retried unknown outcome ran twice there', async () => {
    for (const [path, name, extra] of [['/accounts', 'idempotency-key', { 'x-account': 'A-9' }], ['/orders', 'paypal-request-id', {}]] as const) {
      const before = fx.upstream.received.length
      const res = await rawPost(`${fx.gw.url}${path}`, { ...await asTenantA(), 'x-execution-fence': '1', 'content-type': 'application/json', [name]: `strip-${name}`, connection: name, ...extra })
      expect(res.status, path).toBe(200)
      expect(fx.upstream.received[before]!.headers[name], path).toBe(`strip-${name}`)
    }
  })

  it('a UTF-8 byte-order mark does not hide a JSON body declared as a form', async () => {
    const body = '\uFEFF{"tenant_id":"B","ticket_id":"T1","x":"&tenant_id=A&ticket_id=T2&y="}'
    const before = fx.upstream.received.length
    const res = await rawPost(`${fx.gw.url}/tickets`, { ...await asTenantA(), 'x-execution-fence': '1', 'content-type': 'application/x-www-form-urlencoded' }, body)
    expect([res.status, res.body.code]).toEqual([400, 'unreadable_body'])
    expect(res.body.detail).toContain('declared as a form but is JSON')
    expect(fx.upstream.received.length).toBe(before)
  })

  it('a header the route reads, sent twice, is refused: joined as "A-1, A-1" it fenced another entity than the upstream reads', async () => {
    const before = fx.upstream.received.length
    const twice: [string, Record<string, string | string[]>][] = [
      ['/accounts', { 'x-execution-fence': '3', 'idempotency-key': 'twice-1', 'x-account': ['A-1', 'A-1'] }],
      ['/members', { 'x-tenant': ['A', 'B'] }],
      ['/transfers/1', { 'x-execution-fence': '3', 'content-type': ['application/x-www-form-urlencoded', 'application/json'] }],
    ]
    for (const [path, headers] of twice) {
      const res = await rawPost(`${fx.gw.url}${path}`, { 'content-type': 'application/json', ...await asTenantA(), ...headers }, 'tenant_id=B&ticket_id=T9')
      expect([res.status, res.body.code], path).toEqual([400, 'invalid_request'])
      expect(res.body.detail, path).toContain('more than once')
    }
    expect(fx.upstream.received.length).toBe(before)
    // Once each, they are served.
    expect((await rawPost(`${fx.gw.url}/members`, { ...await asTenantA(), 'content-type': 'application/json', 'x-tenant': 'A' })).status).toBe(200)
  })

  it('a body not declared as a form is read as JSON, whatever else it says it is; a multipart body is refused where the route reads the body', async () => {
    const body = '{"tenant_id":"B","ticket_id":"T1"}'
    const before = fx.upstream.received.length
    for (const type of ['text/plain', undefined]) {
      const res = await rawPost(`${fx.gw.url}/tickets`, { ...await asTenantA(), 'x-execution-fence': '1', ...(type ? { 'content-type': type } : {}) }, body)
      expect([res.status, res.body.code], type).toEqual([403, 'tenant_mismatch'])
    }
    const multipart = '--b\r\nContent-Disposition: form-data; name="tenant_id"\r\n\r\nB\r\n--b\r\nContent-Disposition: form-data; name="ticket_id"\r\n\r\nT1\r\n--b--\r\n'
    // The gateway found no tenant in it, so the claim passed, while an upstream reading multipart acts for tenant B.
    const res = await rawPost(`${fx.gw.url}/transfers/5`, { ...await asTenantA(), 'x-execution-fence': '1', 'content-type': 'multipart/form-data; boundary=b' }, multipart)
    expect([res.status, res.body.code]).toEqual([415, 'unsupported_media_type'])
    expect(res.body.detail).toContain('multipart')
    expect(fx.upstream.received.length).toBe(before)
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
  ])('scanJson(%s) refuses a key named twice: %s', (text, duplicate) => {
    if (duplicate) expect(() => scanJson(text)).toThrow(expect.objectContaining({ code: 'unreadable_body' }))
    else expect(() => scanJson(text)).not.toThrow()
  })
})
