import { describe, expect, it } from 'vitest'
import { ConfigError, parseConfig } from '../src/config/schema.js'
import { RuleError, validateRuleSet } from '../src/rules/schema.js'
import { backends } from './helpers/backends.js'
import { sharedGateway } from './helpers/fresh-gateway.js'
import { post, rawPost, route, testConfig } from './helpers/gateway.js'
import { bearer, hmacAuthenticator, jwtAuth } from './helpers/tokens.js'
import { gate, type ReceivedRequest } from './helpers/upstream.js'

/**
 * A route's `idempotency_key` is a template in the entity grammar: a key from the JSON or
 * form body (Square's `idempotency_key`), another header (PayPal-Request-Id), the path, the
 * query or a natural key built of several; `idempotency_payload: key` lets the key alone name
 * the operation. Each route here names its key another way; the upstream counts executions.
 */
const keyed = (name: string, path: string, extra: Record<string, unknown>) => ({ name, method: 'POST', path, fence: 'optional', idempotency: 'required', timeout_ms: 5000, ...extra })

describe.each(backends())('idempotency keys read by a template, on $name', (backend) => {
  const fx = sharedGateway(backend, async ({ upstream }) => ({
    config: testConfig([
      route(upstream.url, keyed('payments', '/v2/payments', { entity: 'order:{body.order_id}', idempotency_key: '{body.idempotency_key}' })),
      route(upstream.url, keyed('refunds', '/v2/refunds', { entity: 'order:{body.order_id}', idempotency_key: '{body.idempotency_key}' })),
      route(upstream.url, keyed('paypal', '/v2/checkout/orders', { entity: 'order:{header.X-Order}', idempotency_key: '{header.PayPal-Request-Id}' })),
      route(upstream.url, keyed('attempts', '/orders/:order/attempts', { entity: 'order:{params.order}', idempotency_key: 'pay:{params.order}:{query.attempt}' })),
      route(upstream.url, keyed('optional', '/notes', { entity: 'note:{body.note_id}', idempotency: 'optional', idempotency_key: '{body.request_id}' })),
      route(upstream.url, keyed('reports', '/reports', { entity: 'report:{body.report_type}:{body.period}', idempotency_key: 'report:{body.report_type}:{body.period}', idempotency_payload: 'key' })),
      route(upstream.url, keyed('exports', '/exports/:account', { entity: 'account:{params.account}', idempotency_key: 'export:{body.period}', idempotency_payload: 'key' })),
      route(upstream.url, keyed('scoped', '/scoped', { entity: 'order:{body.order_id}', idempotency_key: '{header.PayPal-Request-Id}', upstream_key: 'tenant_scoped' })),
    ], { auth: jwtAuth }),
    authenticate: await hmacAuthenticator(),
  }))
  const executions = () => fx.upstream.received.length
  /** The upstream's answers differ per execution, so a replay is told from a second execution. */
  const answering = (hold?: Promise<void>) => fx.upstream.handle(async (req: ReceivedRequest, res) => {
    const n = fx.upstream.received.length
    await hold
    res.writeHead(201, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ execution: n, path: req.path }))
  })
  const as = async (tenant: string, headers: Record<string, string> = {}) => ({ ...await bearer({ tenant_id: tenant }), ...headers })
  const audit = async (query: string) => (await (await fetch(`${fx.gw.adminUrl}/audit?${query}`, { headers: await bearer({ scope: 'fencegate:admin' }) })).json() as { items: Record<string, unknown>[] }).items

  it('a key in the JSON body: the retry is a replay, and the body reaches the upstream byte for byte', async () => {
    answering()
    const before = executions()
    // Spacing, key order and an escaped character an upstream might read differently: all kept.
    const body = '{ "idempotency_key" : "sq-1",\n "order_id": "o1", "amount_money": {"amount": 100, "currency": "USD"}, "note": "caf\\u00e9" }'
    const first = await post(`${fx.gw.url}/v2/payments`, undefined, { body, headers: await as('A') })
    const again = await post(`${fx.gw.url}/v2/payments`, undefined, { body, headers: await as('A') })
    expect(first.status).toBe(201)
    expect([again.status, again.text]).toEqual([201, first.text])
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(executions()).toBe(before + 1)
    const sent = fx.upstream.received.at(-1)!
    expect(sent.body.equals(Buffer.from(body))).toBe(true)
    expect(sent.headers['idempotency-key']).toBeUndefined()
    // The default payload rule holds: the same key with another body is refused, audited with the key.
    const other = await post(`${fx.gw.url}/v2/payments`, undefined, { body: body.replace('100', '200'), headers: await as('A') })
    expect([other.status, other.json.code]).toEqual([422, 'idempotency_key_reused'])
    expect(await audit('code=idempotency_key_reused')).toEqual([expect.objectContaining({ idempotency_key: 'sq-1', route: 'payments' })])
    expect(executions()).toBe(before + 1)
  })

  it('a key in a form body is read from the same one parse as the entity', async () => {
    answering()
    const before = executions()
    const body = 'idempotency_key=sq-form-1&order_id=o2&amount=5'
    const headers = await as('A', { 'content-type': 'application/x-www-form-urlencoded' })
    const first = await post(`${fx.gw.url}/v2/payments`, undefined, { body, headers })
    const again = await post(`${fx.gw.url}/v2/payments`, undefined, { body, headers })
    expect([first.status, again.headers.get('idempotent-replayed')]).toEqual([201, 'true'])
    expect(executions()).toBe(before + 1)
    expect(fx.upstream.received.at(-1)!.body.toString()).toBe(body)
    // What the entity refuses, the key does too: a JSON text declared as a form, a JSON key named twice.
    const hidden = await post(`${fx.gw.url}/v2/payments`, undefined, { body: '{"idempotency_key":"x","y":"&idempotency_key=z"}', headers })
    expect([hidden.status, hidden.json.code]).toEqual([400, 'unreadable_body'])
    const twice = await post(`${fx.gw.url}/v2/payments`, undefined, { body: '{"idempotency_key":"a","order_id":"o2","idempotency_key":"b"}', headers: await as('A') })
    expect([twice.status, twice.json.code]).toEqual([400, 'unreadable_body'])
    expect(executions()).toBe(before + 1)
  })

  it('a required key the request does not name is 400 idempotency_key_required, audited, nothing forwarded', async () => {
    const before = executions()
    for (const body of ['{"order_id":"o3"}', '{"order_id":"o3","idempotency_key":""}']) {
      const res = await post(`${fx.gw.url}/v2/payments`, undefined, { body, headers: await as('A', { 'idempotency-key': 'header-is-not-the-key' }) })
      expect([res.status, res.json.code], body).toEqual([400, 'idempotency_key_required'])
      expect(res.json.detail).toBe('route payments requires an idempotency key (body.idempotency_key is missing from the request)')
    }
    // A key the body names in a way it cannot be read is refused as such, never read as absent.
    const unreadableBefore = (await audit('code=unreadable_body')).length
    for (const body of ['{"order_id":"o3","idempotency_key":{"nested":1}}', '{"order_id":"o3","idempotency_key":null}', 'not json']) {
      const res = await post(`${fx.gw.url}/v2/payments`, undefined, { body, headers: await as('A', { 'idempotency-key': 'header-is-not-the-key' }) })
      expect([res.status, res.json.code], body).toEqual([400, 'unreadable_body'])
    }
    const missing = await post(`${fx.gw.url}/v2/checkout/orders`, undefined, { headers: await as('A', { 'x-order': 'o3' }) })
    expect(missing.json.detail).toBe('route paypal requires header paypal-request-id')
    expect(await audit('code=idempotency_key_required')).toHaveLength(3)
    expect(await audit('code=unreadable_body')).toHaveLength(unreadableBefore + 3)
    expect(executions()).toBe(before)
  })

  it('a key from the body that is too long or not storable text is invalid_idempotency_key', async () => {
    const before = executions()
    for (const key of ['k'.repeat(256), 'a\u0000b', 'tab\there']) {
      const res = await post(`${fx.gw.url}/v2/payments`, undefined, { body: JSON.stringify({ idempotency_key: key, order_id: 'o4' }), headers: await as('A') })
      expect([res.status, res.json.code]).toEqual([400, 'invalid_idempotency_key'])
    }
    // A number is a key, as it is an entity; 255 characters are allowed.
    answering()
    expect((await post(`${fx.gw.url}/v2/payments`, undefined, { body: JSON.stringify({ idempotency_key: 4711, order_id: 'o4' }), headers: await as('A') })).status).toBe(201)
    expect((await post(`${fx.gw.url}/v2/payments`, undefined, { body: JSON.stringify({ idempotency_key: 'k'.repeat(255), order_id: 'o4' }), headers: await as('A') })).status).toBe(201)
    expect(executions()).toBe(before + 2)
  })

  it('keys stay tenant- and route-scoped: another tenant executes its own, another route refuses the key', async () => {
    answering()
    const before = executions()
    const body = JSON.stringify({ idempotency_key: 'sq-shared', order_id: 'o5' })
    expect((await post(`${fx.gw.url}/v2/payments`, undefined, { body, headers: await as('A') })).status).toBe(201)
    const b = await post(`${fx.gw.url}/v2/payments`, undefined, { body, headers: await as('B') })
    expect([b.status, b.headers.get('idempotent-replayed')]).toEqual([201, null])
    expect(executions()).toBe(before + 2)
    const refund = await post(`${fx.gw.url}/v2/refunds`, undefined, { body, headers: await as('A') })
    expect([refund.status, refund.json.code]).toEqual([422, 'idempotency_key_reused'])
    expect(executions()).toBe(before + 2)
  })

  it('a key in another header (PayPal-Request-Id) is read with the header grammar; Idempotency-Key means nothing there', async () => {
    answering()
    const before = executions()
    const first = await post(`${fx.gw.url}/v2/checkout/orders`, undefined, { headers: await as('A', { 'x-order': 'o6', 'paypal-request-id': 'pp-1', 'idempotency-key': 'one' }) })
    const again = await post(`${fx.gw.url}/v2/checkout/orders`, undefined, { headers: await as('A', { 'x-order': 'o6', 'paypal-request-id': '"pp-1"', 'idempotency-key': 'two' }) })
    expect([first.status, again.headers.get('idempotent-replayed'), again.text]).toEqual([201, 'true', first.text])
    // Idempotency-Key is not this route's key, so it is not echoed as one.
    expect([first.headers.get('idempotency-key'), again.headers.get('idempotency-key')]).toEqual([null, null])
    expect(executions()).toBe(before + 1)
    expect(fx.upstream.received.at(-1)!.headers['paypal-request-id']).toBe('pp-1')
    // Two headers joined by a comma are ambiguous, as for Idempotency-Key.
    const joined = await rawPost(`${fx.gw.url}/v2/checkout/orders`, { ...await as('A'), 'content-type': 'application/json', 'x-order': 'o6', 'paypal-request-id': ['pp-2', 'pp-3'] })
    expect([joined.status, joined.body.code, joined.body.detail]).toEqual([400, 'invalid_idempotency_key', expect.stringMatching(/^header paypal-request-id must be/)])
  })

  it('a key of path, query and literal text names one attempt of one order', async () => {
    answering()
    const before = executions()
    const attempt = async (order: string, n: string) => post(`${fx.gw.url}/orders/${order}/attempts?attempt=${n}`, undefined, { headers: await as('A') })
    expect((await attempt('o7', '1')).status).toBe(201)
    expect((await attempt('o7', '1')).headers.get('idempotent-replayed')).toBe('true')
    expect((await attempt('o7', '2')).headers.get('idempotent-replayed')).toBeNull()
    expect((await attempt('o8', '1')).headers.get('idempotent-replayed')).toBeNull()
    expect(executions()).toBe(before + 3)
    const none = await post(`${fx.gw.url}/orders/o7/attempts`, undefined, { headers: await as('A') })
    expect([none.status, none.json.detail]).toEqual([400, 'route attempts requires an idempotency key (query.attempt is missing from the request)'])
    expect(await audit('entity=order:o7&code=idempotency_key_reused')).toHaveLength(0)
    expect(JSON.stringify(await audit('entity=order:o7'))).toContain('"idempotency_key":null')
  })

  it('on idempotency: optional a request that names no key is forwarded each time', async () => {
    answering()
    const before = executions()
    for (let i = 0; i < 2; i++) expect((await post(`${fx.gw.url}/notes`, undefined, { body: '{"note_id":"n1"}', headers: await as('A') })).status).toBe(201)
    expect((await post(`${fx.gw.url}/notes`, undefined, { body: '{"note_id":"n1","request_id":"r1"}', headers: await as('A') })).status).toBe(201)
    expect((await post(`${fx.gw.url}/notes`, undefined, { body: '{"note_id":"n1","request_id":"r1"}', headers: await as('A') })).headers.get('idempotent-replayed')).toBe('true')
    expect(executions()).toBe(before + 3)
  })

  it('idempotency_payload: key — a natural key: two tabs asking for August are one job, whatever else their bodies say', async () => {
    answering()
    const before = executions()
    const ask = async (requestedAt: string, tenant = 'A') => post(`${fx.gw.url}/reports`, undefined, { body: JSON.stringify({ report_type: 'sales', period: '2026-08', requested_at: requestedAt }), headers: await as(tenant) })
    const first = await ask('10:00:00')
    const reload = await ask('10:00:07')
    expect([first.status, reload.status, reload.text, reload.headers.get('idempotent-replayed')]).toEqual([201, 201, first.text, 'true'])
    expect(executions()).toBe(before + 1)
    // Another period is another job; another tenant's August is its own.
    expect((await post(`${fx.gw.url}/reports`, undefined, { body: '{"report_type":"sales","period":"2026-09"}', headers: await as('A') })).headers.get('idempotent-replayed')).toBeNull()
    expect((await ask('10:00:09', 'B')).headers.get('idempotent-replayed')).toBeNull()
    expect(executions()).toBe(before + 3)
  })

  it('idempotency_payload: key never replays one entity\'s answer for another', async () => {
    answering()
    const before = executions()
    const exp = async (account: string, extra = '') => post(`${fx.gw.url}/exports/${account}`, undefined, { body: `{"period":"2026-08"${extra}}`, headers: await as('A') })
    expect((await exp('a1')).status).toBe(201)
    expect((await exp('a1', ',"format":"csv"')).headers.get('idempotent-replayed')).toBe('true')
    const other = await exp('a2')
    expect([other.status, other.json.code]).toEqual([422, 'idempotency_key_reused'])
    expect(executions()).toBe(before + 1)
  })

  it('Connection cannot strip the Content-Type a body key was read with (only the key reads the body here)', async () => {
    answering()
    const res = await rawPost(`${fx.gw.url}/exports/a9`, { ...await as('A'), 'content-type': 'application/x-www-form-urlencoded', connection: 'content-type' }, 'period=2026-10')
    expect(res.status).toBe(201)
    expect(fx.upstream.received.at(-1)!.headers['content-type']).toBe('application/x-www-form-urlencoded')
  })

  it('upstream_key: tenant_scoped on a key header replaces that header upstream, one per tenant and key', async () => {
    answering()
    const send = async (tenant: string) => post(`${fx.gw.url}/scoped`, undefined, { body: '{"order_id":"o9"}', headers: await as(tenant, { 'paypal-request-id': 'pp-shared' }) })
    await send('A')
    await send('B')
    const [a, b] = fx.upstream.received.slice(-2).map((r) => String(r.headers['paypal-request-id']))
    expect(a).toMatch(/^fg1-[0-9a-f]{64}$/)
    expect(b).toMatch(/^fg1-[0-9a-f]{64}$/)
    expect(a).not.toBe(b)
    expect(fx.upstream.received.slice(-2).map((r) => r.headers['idempotency-key'])).toEqual([undefined, undefined])
  })

  it('20 concurrent calls on 5 body keys execute 5 times, and every caller gets its key\'s answer', async () => {
    const hold = gate()
    answering(hold.opened)
    const before = executions()
    const arrivedAll = fx.upstream.arrived(before + 5)
    const calls = Array.from({ length: 20 }, async (_, i) => post(`${fx.gw.url}/v2/payments`, undefined, {
      body: JSON.stringify({ idempotency_key: `conc-${i % 5}`, order_id: `oc${i % 5}` }), headers: await as('A'),
    }))
    // The five originals are at the upstream, held, while their fifteen duplicates arrive at the gateway.
    await arrivedAll
    hold.open()
    const results = await Promise.all(calls)
    expect(executions()).toBe(before + 5)
    for (let k = 0; k < 5; k++) {
      const mine = results.filter((_, i) => i % 5 === k)
      expect(mine.map((r) => r.status)).toEqual([201, 201, 201, 201])
      expect(new Set(mine.map((r) => r.text)).size).toBe(1)
    }
    const keys = fx.upstream.received.slice(before).map((r) => JSON.parse(r.body.toString()).idempotency_key as string)
    expect(keys.sort()).toEqual(['conc-0', 'conc-1', 'conc-2', 'conc-3', 'conc-4'])
  })
})

describe('idempotency_key and idempotency_payload in the configuration and the rules API', () => {
  const base = { name: 'r', method: 'POST', path: '/p/:id', upstream: 'http://127.0.0.1:9001', entity: 'p:{params.id}', idempotency: 'required' }
  const problemsOf = (r: Record<string, unknown>) => {
    try {
      parseConfig({ routes: [{ ...base, ...r }] })
    } catch (err) {
      expect(err).toBeInstanceOf(ConfigError)
      return (err as ConfigError).problems
    }
    throw new Error('accepted')
  }

  it('defaults to the Idempotency-Key header and the request payload', () => {
    expect(parseConfig({ routes: [base] }).routes[0]).toMatchObject({ idempotency_key: '{header.Idempotency-Key}', idempotency_payload: 'request' })
  })

  it('names routes[i].idempotency_key for a template that does not compile or reads a param the path lacks', () => {
    expect(problemsOf({ idempotency_key: 'constant' })).toEqual(['routes[0].idempotency_key: a key template needs at least one {placeholder}'])
    expect(problemsOf({ idempotency_key: '{cookie.sid}' })).toEqual([expect.stringMatching(/^routes\[0\]\.idempotency_key: placeholder \{cookie\.sid\}: unknown source/)])
    expect(problemsOf({ idempotency_key: '{body.a' })).toEqual(['routes[0].idempotency_key: unbalanced { or }'])
    expect(problemsOf({ idempotency_key: 'k:{params.other}' })).toEqual(['routes[0].idempotency_key: uses params.other, which /p/:id does not define'])
    expect(problemsOf({ idempotency_payload: 'body' })).toEqual([expect.stringMatching(/^routes\[0\]\.idempotency_payload: /)])
  })

  it('refuses upstream_key: tenant_scoped where the key is not one header: the body goes upstream as sent', () => {
    expect(problemsOf({ idempotency_key: '{body.idempotency_key}', upstream_key: 'tenant_scoped' })).toEqual([expect.stringMatching(/^routes\[0\]\.upstream_key: tenant_scoped replaces the header the key is read from/)])
    expect(problemsOf({ idempotency_key: 'k:{header.X-Key}', upstream_key: 'tenant_scoped' })).toHaveLength(1)
    expect(parseConfig({ routes: [{ ...base, idempotency_key: '{header.PayPal-Request-Id}', upstream_key: 'tenant_scoped' }] }).routes).toHaveLength(1)
  })

  it('the rules API validates the same fields and stores them', () => {
    expect(() => validateRuleSet([{ ...base, idempotency_key: 'k:{params.nope}' }], 'none')).toThrow(RuleError)
    expect(() => validateRuleSet([{ ...base, idempotency_key: 'k:{params.nope}' }], 'none')).toThrow(/r: idempotency_key: uses params\.nope/)
    expect(validateRuleSet([{ ...base, idempotency_key: '{body.k}', idempotency_payload: 'key' }], 'none').routes[0]).toMatchObject({ idempotency_key: '{body.k}', idempotency_payload: 'key' })
  })
})
