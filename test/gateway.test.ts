import { connect } from 'node:net'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { post, rawPost, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { closedPort, drainedOrClosed, gate, startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * POSTs over node:http, which sends header lines as given: a header twice, or a
 * Connection header (both of which fetch would refuse or merge).
 */

describe.each(backends())('gateway on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway

  async function start(routes: Record<string, unknown>[], extra: Record<string, unknown> = {}) {
    gw = await startTestGateway({ config: testConfig(routes, extra), store: t.store })
  }
  const audit = async (query = '') => (await (await fetch(`${gw.adminUrl}/audit?${query}`)).json()).items as any[]

  beforeEach(async () => {
    t = await backend.open()
    upstream = await startUpstream()
  })
  afterEach(async () => {
    await gw?.close()
    await upstream.close()
    await t.close()
  })

  it('forwards the first, an equal and a higher fence, with path, query, body and fence unchanged', async () => {
    await start([route(upstream.url)])
    const body = JSON.stringify({ amount: 1299, note: 'ünïcode' })
    for (const fence of ['5', '5', '6']) {
      const res = await post(`${gw.url}/payments/42/capture?mode=full&x=%20y`, fence, { body })
      expect(res.status).toBe(200)
    }
    expect(upstream.received.map((r) => [r.path, r.headers['x-execution-fence'], r.body.toString()])).toEqual([
      ['/payments/42/capture?mode=full&x=%20y', '5', body],
      ['/payments/42/capture?mode=full&x=%20y', '5', body],
      ['/payments/42/capture?mode=full&x=%20y', '6', body],
    ])
    const entity = await (await fetch(`${gw.adminUrl}/entities/invoice:42`)).json()
    expect(entity).toMatchObject({ entity: 'invoice:42', highest_fence: '6' })
  })

  it('rejects a stale fence with 409, never forwards it and audits it', async () => {
    await start([route(upstream.url)])
    expect((await post(`${gw.url}/payments/42/capture`, '9')).status).toBe(200)
    const res = await post(`${gw.url}/payments/42/capture`, '8', { body: '{"secret":"card 4242"}', headers: { 'x-request-id': 'stale-1' } })
    expect(res.status).toBe(409)
    expect(res.headers.get('content-type')).toBe('application/problem+json')
    expect(res.json).toMatchObject({
      code: 'stale_fence', status: 409, entity: 'invoice:42', presented_fence: '8', highest_fence: '9',
      type: 'urn:fencegate:problem:stale_fence', request_id: 'stale-1',
    })
    expect(upstream.received.map((r) => r.headers['x-execution-fence'])).toEqual(['9'])
    const [row] = await audit('code=stale_fence')
    expect(row).toMatchObject({ entity: 'invoice:42', presented_fence: '8', highest_fence: '9', request_id: 'stale-1', route: 'capture' })
    // The audit row holds the body's hash, never the body.
    expect(row.body_sha256).toMatch(/^[0-9a-f]{64}$/)
    expect(JSON.stringify(row)).not.toContain('4242')
  })

  it.each([
    ['-1'], ['1.5'], ['0x10'], ['9223372036854775808'], [''], ['1, 2'], ['abc'],
  ])('rejects the malformed fence %j with 400 invalid_fence and an audit row', async (fence) => {
    await start([route(upstream.url)])
    const res = await rawPost(`${gw.url}/payments/1/capture`, { 'x-execution-fence': fence, 'x-request-id': 'bad-fence' })
    expect(res.status).toBe(400)
    expect(res.body.code).toBe('invalid_fence')
    expect(upstream.received).toHaveLength(0)
    expect(await audit('code=invalid_fence')).toMatchObject([{ request_id: 'bad-fence', route: 'capture', presented_fence: null }])
  })

  it('rejects two X-Execution-Fence headers with 400 invalid_fence', async () => {
    await start([route(upstream.url)])
    const res = await rawPost(`${gw.url}/payments/1/capture`, { 'x-execution-fence': ['1', '2'] })
    expect(res).toMatchObject({ status: 400, body: { code: 'invalid_fence' } })
    expect(upstream.received).toHaveLength(0)
    expect(await audit('code=invalid_fence')).toHaveLength(1)
  })

  it('answers a missing fence on a required route with 428 and audits it', async () => {
    await start([route(upstream.url)])
    const res = await post(`${gw.url}/payments/1/capture`)
    expect(res.status).toBe(428)
    expect(res.json.code).toBe('fence_required')
    expect(upstream.received).toHaveLength(0)
    expect(await audit()).toMatchObject([{ code: 'fence_required' }])
  })

  it('forwards without a fence on an optional route but still enforces one that is presented', async () => {
    await start([route(upstream.url, { fence: 'optional' })])
    expect((await post(`${gw.url}/payments/1/capture`)).status).toBe(200)
    expect((await post(`${gw.url}/payments/1/capture`, '3')).status).toBe(200)
    expect((await post(`${gw.url}/payments/1/capture`, '2')).status).toBe(409)
    expect((await post(`${gw.url}/payments/1/capture`, 'junk')).status).toBe(400)
    expect(upstream.received).toHaveLength(2)
  })

  it('does not look at fences on a route with fence: off', async () => {
    await start([route(upstream.url, { fence: 'off', entity: undefined })])
    expect((await post(`${gw.url}/payments/1/capture`, 'not-a-fence')).status).toBe(200)
    expect((await post(`${gw.url}/payments/1/capture`)).status).toBe(200)
    expect(upstream.received).toHaveLength(2)
    expect(await audit()).toEqual([])
  })

  it('resolves entities from query, header and JSON body, and answers 400 entity_unresolved otherwise', async () => {
    await start([
      route(upstream.url, { name: 'q', path: '/q', entity: 'acct:{query.account}' }),
      route(upstream.url, { name: 'h', path: '/h', entity: 'acct:{header.X-Account}' }),
      route(upstream.url, { name: 'b', path: '/b', entity: 'ticket:{body.ticket.id}' }),
    ])
    expect((await post(`${gw.url}/q?account=7`, '1')).status).toBe(200)
    expect((await post(`${gw.url}/h`, '1', { headers: { 'x-account': '7' } })).status).toBe(200)
    expect((await post(`${gw.url}/b`, '1', { body: '{"ticket":{"id":"T-1"}}' })).status).toBe(200)
    // Same entity acct:7 through two routes: one fence order.
    expect((await post(`${gw.url}/h`, '0', { headers: { 'x-account': '7' } })).json.code).toBe('stale_fence')
    for (const [path, init] of [['/q', {}], ['/h', {}], ['/b', { body: '{"ticket":{}}' }]] as const) {
      const res = await post(`${gw.url}${path}`, '1', init)
      expect(res.status).toBe(400)
      expect(res.json.code).toBe('entity_unresolved')
    }
    // A body that is not JSON is unreadable, not a body without the entity.
    const unreadable = await post(`${gw.url}/b`, '1', { body: 'not json' })
    expect([unreadable.status, unreadable.json.code]).toEqual([400, 'unreadable_body'])
    expect(upstream.received).toHaveLength(3)
    expect(await audit('code=entity_unresolved')).toHaveLength(3)
    expect(await audit('code=unreadable_body')).toHaveLength(1)
  })

  it('answers 400, not 503, for an entity with NUL (regression: PostgreSQL refused it)', async () => {
    // A NUL in the path no longer gets this far (the raw-target guard refuses %00); one in the body does.
    await start([route(upstream.url, { name: 'tickets', path: '/tickets', entity: 'ticket:{body.t}' })])
    const res = await post(`${gw.url}/tickets`, '1', { body: '{"t":"a\\u0000b"}' })
    expect([res.status, res.json.code]).toEqual([400, 'entity_unresolved'])
    expect(await audit('code=entity_unresolved')).toHaveLength(1)
  })

  it('forwards a header the entity was read from even when Connection names it (regression)', async () => {
    await start([route(upstream.url, { name: 'h', path: '/h', entity: 'acct:{header.X-Account}' })])
    const res = await rawPost(`${gw.url}/h`, { 'x-execution-fence': '1', 'x-account': 'A-1', connection: 'x-account' })
    expect(res.status).toBe(200)
    expect(upstream.received[0]!.headers['x-account']).toBe('A-1')
  })

  it('answers 404 no_route for anything not configured, including traversal out of a route', async () => {
    await start([route(upstream.url)])
    for (const path of ['/', '/payments/1', '/payments/1/capture/x', '/payments/../admin', '/payments/1/%2e%2e/capture', '//evil.example/payments/1/capture']) {
      const res = await fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'x-execution-fence': '1' } })
      expect(res.status, path).toBe(404)
      expect((await res.json()).code).toBe('no_route')
    }
    const get = await fetch(`${gw.url}/payments/1/capture`, { headers: { 'x-execution-fence': '1' } })
    expect(get.status).toBe(404)
    expect(upstream.received).toHaveLength(0)
  })

  it('passes the upstream status, headers and body through, minus hop-by-hop headers', async () => {
    upstream.handle((_req, res) => {
      res.writeHead(201, { location: '/payments/42', 'x-upstream': 'yes', 'keep-alive': 'timeout=1', 'content-type': 'text/plain' })
      res.end('created')
    })
    await start([route(upstream.url)])
    const res = await rawPost(`${gw.url}/payments/42/capture`, {
      'x-execution-fence': '1', 'x-client': 'c', 'x-drop-me': 'secret', connection: 'x-drop-me, x-execution-fence', 'x-request-id': 'rid-1',
    })
    expect(res.status).toBe(201)
    expect(res.headers.location).toBe('/payments/42')
    expect(res.headers['x-upstream']).toBe('yes')
    expect(res.headers['x-request-id']).toBe('rid-1')
    expect(res.headers['keep-alive']).not.toBe('timeout=1')
    expect(res.body).toBe('created')
    const [received] = upstream.received
    expect(received!.headers['x-client']).toBe('c')
    expect(received!.headers['x-drop-me']).toBeUndefined()
    // Naming the fence in Connection does not hide it from the upstream.
    expect(received!.headers['x-execution-fence']).toBe('1')
    expect(received!.headers['x-request-id']).toBe('rid-1')
  })

  it('adds no Content-Type the upstream did not send, also on the first answer for a key', async () => {
    upstream.handle((_req, res) => {
      res.removeHeader('content-type')
      res.end('untyped')
    })
    await start([route(upstream.url, { idempotency: 'optional' })])
    const plain = await rawPost(`${gw.url}/payments/1/capture`, { 'x-execution-fence': '1' })
    const keyed = await rawPost(`${gw.url}/payments/2/capture`, { 'x-execution-fence': '1', 'idempotency-key': 'untyped-1' })
    for (const res of [plain, keyed]) {
      expect([res.status, res.body, res.headers['content-type']]).toEqual([200, 'untyped', undefined])
    }
  })

  it('forwards a request sent with Expect: 100-continue (regression: undici refused the header, answered 502)', async () => {
    await start([route(upstream.url)])
    const res = await rawPost(`${gw.url}/payments/1/capture`, { 'x-execution-fence': '1', expect: '100-continue' })
    expect(res.status).toBe(200)
    expect(upstream.received[0]!.headers.expect).toBeUndefined()
  })

  it('streams the response: the client reads the first chunk before the upstream finishes', async () => {
    const { opened: finished, open: finish } = gate()
    upstream.handle(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain' })
      res.write('first;')
      await finished
      res.end('last')
    })
    await start([route(upstream.url)])
    const res = await fetch(`${gw.url}/payments/1/capture`, { method: 'POST', headers: { 'x-execution-fence': '1' }, body: '{}' })
    const reader = res.body!.getReader()
    const first = await reader.read()
    expect(new TextDecoder().decode(first.value)).toBe('first;')
    finish()
    let rest = ''
    for (let r = await reader.read(); !r.done; r = await reader.read()) rest += new TextDecoder().decode(r.value)
    expect(rest).toBe('last')
  })

  it('survives a client that disconnects in the middle of a streamed response', async () => {
    // Regression: Readable.toWeb threw an uncaught ERR_INVALID_STATE when the client went
    // away while upstream data was still arriving, killing the process (nodejs/node#54205).
    const { opened: closed, open: upstreamClosed } = gate()
    upstream.handle(async (_req, res) => {
      res.on('close', upstreamClosed)
      res.writeHead(200, { 'content-type': 'application/octet-stream' })
      const chunk = Buffer.alloc(64 * 1024, 1)
      for (let i = 0; i < 4000 && !res.destroyed; i++) {
        if (!res.write(chunk)) await drainedOrClosed(res)
      }
      res.end()
    })
    await start([route(upstream.url)])
    for (let i = 0; i < 5; i++) {
      const controller = new AbortController()
      const res = await fetch(`${gw.url}/payments/1/capture`, { method: 'POST', headers: { 'x-execution-fence': '1' }, body: '{}', signal: controller.signal })
      await res.body!.getReader().read()
      controller.abort()
    }
    await closed
    // Many clients that drop their sockets right after the first response bytes.
    upstream.handle((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ pad: 'x'.repeat(2000) }))
    })
    const { port } = new URL(gw.url)
    await Promise.all(Array.from({ length: 50 }, () => new Promise<void>((resolve) => {
      const socket = connect(Number(port), '127.0.0.1', () => {
        socket.write('POST /payments/1/capture HTTP/1.1\r\nhost: x\r\nx-execution-fence: 1\r\ncontent-length: 2\r\n\r\n{}')
      })
      socket.once('data', () => socket.destroy())
      socket.on('close', () => resolve())
    })))
    // The process is still serving: a later request through the same gateway works.
    upstream.handle((_req, res) => {
      res.end('ok')
    })
    expect((await post(`${gw.url}/payments/1/capture`, '1')).status).toBe(200)
  })

  it('answers 502 upstream_unreachable when the upstream refuses the connection', async () => {
    await start([route(`http://127.0.0.1:${await closedPort()}`)])
    const res = await post(`${gw.url}/payments/1/capture`, '1')
    expect(res.status).toBe(502)
    expect(res.json.code).toBe('upstream_unreachable')
  })

  it('answers 504 upstream_timeout when the upstream does not answer within timeout_ms', async () => {
    upstream.handle(() => {})
    await start([route(upstream.url, { timeout_ms: 200 })])
    const res = await post(`${gw.url}/payments/1/capture`, '1')
    expect(res.status).toBe(504)
    expect(res.json.code).toBe('upstream_timeout')
    expect(upstream.received).toHaveLength(1)
  })

  it('fails closed: with the store down it answers 503 and forwards nothing', async () => {
    await start([route(upstream.url)])
    expect((await post(`${gw.url}/payments/1/capture`, '1')).status).toBe(200)
    await t.breakStore()
    const res = await post(`${gw.url}/payments/1/capture`, '2')
    expect(res.status).toBe(503)
    expect(res.json.code).toBe('store_unavailable')
    expect(JSON.stringify(res.json)).not.toMatch(/fencegate_t|database|relation|postgres/i)
    expect(upstream.received).toHaveLength(1)
    const health = await fetch(`${gw.adminUrl}/health`)
    expect(health.status).toBe(503)
  })

  it('refuses a body over max_request_body with 413, buffered or streamed', async () => {
    await start([route(upstream.url), route(upstream.url, { name: 'open', path: '/open', fence: 'off', entity: undefined })], { server: { max_request_body: 64 } })
    const big = 'x'.repeat(65)
    expect((await post(`${gw.url}/payments/1/capture`, '1', { body: big })).json.code).toBe('body_too_large')
    expect((await post(`${gw.url}/open`, undefined, { body: big })).json.code).toBe('body_too_large')
    expect((await post(`${gw.url}/payments/1/capture`, '1', { body: 'x'.repeat(64) })).status).toBe(200)
    expect(upstream.received).toHaveLength(1)
    expect(await audit('code=body_too_large')).toHaveLength(1)
  })
})
