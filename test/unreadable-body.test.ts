import { deflateSync, gzipSync } from 'node:zlib'
import { describe, expect, it } from 'vitest'
import { backends } from './helpers/backends.js'
import { sharedGateway } from './helpers/fresh-gateway.js'
import { post, rawPost, route, testConfig } from './helpers/gateway.js'
import { bearer, hmacAuthenticator, jwtAuth } from './helpers/tokens.js'

/**
 * The second security review's HIGH finding and its relatives, replayed as sent: where the
 * gateway could not read a body, it decided as if the body said nothing (no claimed tenant, no
 * entity), while a stock upstream read it and acted for tenant B. Each request below was
 * forwarded before; now each is refused (400 `unreadable_body` or 415
 * `unsupported_media_type`) and the upstream receives nothing.
 */
describe('a body the gateway cannot read the way an upstream would is refused, never read as silent', () => {
  const fx = sharedGateway(backends()[0]!, async ({ upstream }) => ({
    config: testConfig([
      route(upstream.url, { name: 'tickets', path: '/tickets', entity: 'ticket:{body.ticket_id}', claimed_tenant: 'body.tenant_id' }),
      route(upstream.url, { name: 'members', path: '/members', entity: undefined, fence: 'off', claimed_tenant: 'body.tenant_id' }),
      route(upstream.url, { name: 'by-header', path: '/by-header', entity: undefined, fence: 'off', claimed_tenant: 'header.X-Tenant' }),
    ], { auth: jwtAuth }),
    authenticate: await hmacAuthenticator(),
  }))
  const asA = () => bearer({ tenant_id: 'A' })
  const forB = '{"tenant_id":"B","ticket_id":"T1"}'
  const send = async (path: string, headers: Record<string, string>, body: string | Uint8Array) => {
    const before = fx.upstream.received.length
    const res = await rawPost(`${fx.gw.url}${path}`, { 'x-execution-fence': '1', ...await asA(), ...headers }, body)
    return { ...res, forwarded: fx.upstream.received.length - before }
  }
  const utf16 = (text: string, le: boolean) => {
    const b = Buffer.from(text, 'utf16le')
    if (!le) b.swap16()
    return new Uint8Array(b)
  }

  it.each([
    ['gzip', gzipSync(forB)],
    ['deflate', deflateSync(forB)],
    ['br, identity', Buffer.from(forB)],
  ])('a body in Content-Encoding %s is 415: the gateway saw no tenant, Express inflated it and read B', async (encoding, bytes) => {
    const res = await send('/tickets', { 'content-type': 'application/json', 'content-encoding': encoding }, new Uint8Array(bytes))
    expect([res.status, res.body.code, res.forwarded]).toEqual([415, 'unsupported_media_type', 0])
  })

  it('a charset other than UTF-8 is 415: as UTF-16LE the gateway read nothing, the upstream decoded B', async () => {
    for (const charset of ['utf-16le', 'UTF-16', 'iso-8859-1', '"us-ascii"']) {
      const res = await send('/tickets', { 'content-type': `application/json; charset=${charset}` }, utf16(forB, true))
      expect([res.status, res.body.code, res.forwarded], charset).toEqual([415, 'unsupported_media_type', 0])
    }
    expect((await send('/tickets', { 'content-type': 'application/json; charset="UTF-8"' }, '{"tenant_id":"A","ticket_id":"T1"}')).status).toBe(200)
  })

  it('UTF-16 without a charset (Python\'s json.loads detects it) and bytes that are not UTF-8 are 400', async () => {
    for (const [name, body] of [['UTF-16LE', utf16(forB, true)], ['UTF-16BE', utf16(forB, false)], ['an invalid byte', new Uint8Array([...Buffer.from('{"tenant_id":"B","ticket_id":"T1","x":"'), 0xff, 0x22, 0x7d])]] as const) {
      const res = await send('/tickets', { 'content-type': 'application/json' }, body)
      expect([res.status, res.body.code, res.forwarded], name).toEqual([400, 'unreadable_body', 0])
    }
  })

  it('last week\'s form/JSON attack re-encoded as UTF-16BE is refused: the gateway fenced T2 for A, Python read T1 for B', async () => {
    const body = utf16('{"tenant_id":"B","ticket_id":"T1","x":"&tenant_id=A&ticket_id=T2&y="}', false)
    const res = await send('/tickets', { 'content-type': 'application/x-www-form-urlencoded' }, body)
    expect([res.status, res.body.code, res.forwarded]).toEqual([400, 'unreadable_body', 0])
  })

  it.each([
    ['NaN', '{"tenant_id":"B","ticket_id":"T1","n":NaN}'],
    ['a trailing comma', '{"tenant_id":"B","ticket_id":"T1",}'],
    ['single quotes', "{'tenant_id':'B','ticket_id':'T1'}"],
    ['a comment', '{"tenant_id":"B",/* x */"ticket_id":"T1"}'],
  ])('JSON with %s, which lenient readers take, is 400', async (_name, body) => {
    for (const path of ['/tickets', '/members']) {
      const res = await send(path, { 'content-type': 'application/json' }, body)
      expect([res.status, res.body.code, res.forwarded], path).toEqual([400, 'unreadable_body', 0])
    }
  })

  it('a name that matches the claim only in another case is 400: Go\'s and ASP.NET\'s readers match fields case-insensitively', async () => {
    const bodies = [
      '{"TENANT_ID":"B","ticket_id":"T1"}',
      '{"tenant_id":"A","Tenant_Id":"B","ticket_id":"T1"}',
      '{"tenant_id":"A","ticket_ID":"T2","ticket_id":"T1"}',
      // The Kelvin sign folds to k in Go's reader.
      '{"tenant_id":"A","tic\u212Aet_id":"T2","ticket_id":"T1"}',
    ]
    for (const body of bodies) {
      const res = await send('/tickets', { 'content-type': 'application/json' }, body)
      expect([res.status, res.body.code, res.forwarded], body).toEqual([400, 'unreadable_body', 0])
    }
    // Fields the route does not read may differ only in case.
    expect((await send('/tickets', { 'content-type': 'application/json' }, '{"tenant_id":"A","ticket_id":"T1","note":"a","Note":"b"}')).status).toBe(200)
  })

  it('a header X_Tenant beside the X-Tenant the route reads is 400: WSGI and CGI read _ as -', async () => {
    const res = await send('/by-header', { 'x-tenant': 'A', 'x_tenant': 'B' }, '{}')
    expect([res.status, res.body.code, res.forwarded]).toEqual([400, 'invalid_request', 0])
    expect(res.body.detail).toContain('x_tenant')
    const alone = await send('/by-header', { 'x_tenant': 'B' }, '{}')
    expect([alone.status, alone.forwarded]).toEqual([400, 0])
    expect((await send('/by-header', { 'x-tenant': 'A', 'x_other': 'B' }, '{}')).status).toBe(200)
  })

  it('a tenant id beyond 2^53 is 400: it parses to another number than the one written', async () => {
    const res = await send('/members', { 'content-type': 'application/json' }, '{"tenant_id":9007199254740993}')
    expect([res.status, res.body.code, res.forwarded]).toEqual([400, 'unreadable_body', 0])
    for (const body of ['{"tenant_id":["B"]}', '{"tenant_id":{"id":"B"}}', '{"tenant_id":true}']) {
      expect((await send('/members', { 'content-type': 'application/json' }, body)).status, body).toBe(400)
    }
  })

  it('a form naming the tenant twice, or not starting with a field name, is 400', async () => {
    for (const body of ['tenant_id=A&tenant_id=B', 'tenant_id=A&TENANT_ID=B', '&tenant_id=B', '=x&tenant_id=B', ' tenant_id=B']) {
      const res = await send('/members', { 'content-type': 'application/x-www-form-urlencoded' }, body)
      expect([res.status, res.body.code, res.forwarded], body).toEqual([400, 'unreadable_body', 0])
    }
    expect((await send('/members', { 'content-type': 'application/x-www-form-urlencoded' }, 'tenant_id=A')).status).toBe(200)
  })
})

describe('entity ids in one canonical form', () => {
  const fx = sharedGateway(backends()[0]!, async ({ upstream }) => ({
    config: testConfig([
      route(upstream.url, { name: 'capture', path: '/payments/:invoice_id/capture', entity: 'invoice:{params.invoice_id:int}' }),
      route(upstream.url, { name: 'loose', path: '/loose/:invoice_id', entity: 'invoice:{params.invoice_id}' }),
      route(upstream.url, { name: 'orders', path: '/orders/:id', entity: 'order:{params.id:uuid}' }),
      route(upstream.url, { name: 'body-int', path: '/charges', entity: 'invoice:{body.invoice_id:int}' }),
    ], { entity_rules: [{ name: 'hold', entity_match: 'invoice:42', frozen: true }] }),
  }))

  it.each(['042', '77x', '+77', '77.0', '42%20', '%EF%BC%94%EF%BC%92', '-1', '9007199254740993'])('an :int part refuses %s with 400 entity_unresolved, before the fence step', async (id) => {
    const before = fx.upstream.received.length
    const res = await post(`${fx.gw.url}/payments/${id}/capture`, '1')
    expect([res.status, res.json.code]).toEqual([400, 'entity_unresolved'])
    expect(res.json.detail).toContain('params.invoice_id')
    expect(fx.upstream.received.length).toBe(before)
  })

  it('042 no longer passes a freeze on invoice:42', async () => {
    expect((await post(`${fx.gw.url}/payments/042/capture`, '1')).json.code).toBe('entity_unresolved')
    expect((await post(`${fx.gw.url}/payments/42/capture`, '1')).json.code).toBe('entity_frozen')
    expect((await post(`${fx.gw.url}/payments/77/capture`, '1')).status).toBe(200)
  })

  it('an untyped part refuses whitespace, control and format characters and non-ASCII digits', async () => {
    for (const id of ['42%20', '%2042', '42%09', '4%E2%80%8B2', '%EF%BC%94%EF%BC%92', '%D9%A4%D9%A2']) {
      const res = await post(`${fx.gw.url}/loose/${id}`, '1')
      expect([res.status, res.json.code], id).toEqual([400, 'entity_unresolved'])
    }
    expect((await post(`${fx.gw.url}/loose/inv-7`, '1')).status).toBe(200)
  })

  it('a :uuid part reads either case as one entity, so one fence order', async () => {
    const id = '3f2a1c9e-0b7d-4e8a-9c1f-5a6b7c8d9e0f'
    expect((await post(`${fx.gw.url}/orders/${id.toUpperCase()}`, '5')).status).toBe(200)
    const stale = await post(`${fx.gw.url}/orders/${id}`, '4')
    expect([stale.status, stale.json.code]).toEqual([409, 'stale_fence'])
    expect((await post(`${fx.gw.url}/orders/${id.replaceAll('-', '')}`, '6')).json.code).toBe('entity_unresolved')
  })

  it('a JSON number read by an :int part must be written plainly', async () => {
    expect((await post(`${fx.gw.url}/charges`, '1', { body: '{"invoice_id":77}' })).status).toBe(200)
    for (const body of ['{"invoice_id":77.0}', '{"invoice_id":7.7e1}', '{"invoice_id":"077"}']) {
      expect((await post(`${fx.gw.url}/charges`, '1', { body })).status, body).toBe(400)
    }
  })
})
