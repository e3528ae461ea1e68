import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { gzipSync } from 'node:zlib'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { ConfigError, parseConfig } from '../src/config/schema.js'
import { createFetchForward } from '../src/runtime/workers/forward.js'
import { ForwardError, type ForwardRequest } from '../src/gateway/forward.js'
import { toResponse } from '../src/http/exchange.js'
import { createWorker, type FencegateWorker } from '../src/runtime/workers/app.js'
import type { WorkerContext, WorkerEnv } from '../src/runtime/workers/bindings.js'
import worker from '../src/runtime/workers/entry.js'
import { backends, type TestDb } from './helpers/backends.js'
import { issuer, audience, secret, token } from './helpers/tokens.js'
import { closedPort, gate, startUpstream, type TestUpstream } from './helpers/upstream.js'

const postgres = backends().find((b) => b.name === 'postgres')

/** The configuration a deployment would put in FENCEGATE_CONFIG; secrets come from the other bindings. */
function configText(upstream: string, route: Record<string, unknown> = {}): string {
  const fields = { name: 'capture', method: 'POST', path: '/payments/:invoice_id/capture', upstream, entity: 'invoice:{params.invoice_id}', timeout_ms: 5000, ...route }
  return `
auth:
  mode: jwt
  issuer: ${issuer}
  audience: ${audience}
  hs256_secret: \${FENCEGATE_JWT_SECRET}
store:
  url: \${DATABASE_URL}
log:
  level: silent
routes:
  - ${Object.entries(fields).map(([k, v]) => `${k}: ${JSON.stringify(v)}`).join('\n    ')}
`
}

/** An ExecutionContext whose waitUntil work the test can wait for. */
function context(): WorkerContext & { settled(): Promise<void> } {
  const pending: Promise<unknown>[] = []
  return {
    waitUntil: (p) => void pending.push(p),
    settled: async () => void (await Promise.all(pending)),
  }
}

async function send(w: Pick<FencegateWorker, 'fetch'>, ctx: WorkerContext, path: string, init: RequestInit & { fence?: string; scope?: string } = {}) {
  const headers = new Headers(init.headers)
  headers.set('authorization', `Bearer ${await token(init.scope ? { scope: init.scope } : {})}`)
  if (init.fence !== undefined) headers.set('x-execution-fence', init.fence)
  const method = init.method ?? 'POST'
  const res = await w.fetch(new Request(`https://gateway.example${path}`, { method, headers, body: method === 'GET' ? null : (init.body ?? '{}') }), ctx)
  const text = await res.text()
  let json: any
  try {
    json = JSON.parse(text)
  } catch {}
  return { status: res.status, headers: res.headers, text, json }
}

describe.skipIf(!postgres)('the Worker entry on PostgreSQL', () => {
  let t: TestDb
  let upstream: TestUpstream
  let w: FencegateWorker
  let ctx: ReturnType<typeof context>

  const env = (extra: Partial<WorkerEnv> = {}, route: Record<string, unknown> = {}): WorkerEnv => ({
    FENCEGATE_CONFIG: configText(upstream.url, route),
    DATABASE_URL: t.url,
    FENCEGATE_JWT_SECRET: secret,
    ...extra,
  })
  /** Connections the Worker left open to the test database (the test's own excluded). */
  const openConnections = async () => {
    const [row] = await t.db.sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`
    return row!.n
  }

  beforeEach(async () => {
    t = await postgres!.open()
    upstream = await startUpstream()
    ctx = context()
  })
  afterEach(async () => {
    await w?.close()
    await upstream.close()
    await t.close()
  })

  it('forwards a fenced request through the fetch forward and answers it', async () => {
    w = await createWorker(env())
    const res = await send(w, ctx, '/payments/42/capture?mode=full', { fence: '5', body: '{"amount":1299}' })
    expect(res.status).toBe(200)
    expect(res.json).toEqual({ method: 'POST', path: '/payments/42/capture?mode=full', fence: '5' })
    expect(res.headers.get('x-request-id')).toMatch(/.+/)
    const [received] = upstream.received
    expect(received!.body.toString()).toBe('{"amount":1299}')
    // The fetch forward's own Accept-Encoding (undici's forward would pass the client's).
    expect(received!.headers['accept-encoding']).toBe('gzip')
    expect(received!.headers.authorization).toBeUndefined()
    expect(await t.store.getEntity('acme', 'invoice:42')).toMatchObject({ highest_fence: '5' })
    await ctx.settled()
    expect(await openConnections()).toBe(0)
  })

  it("continues the caller's trace to the upstream: traceparent and tracestate pass as sent (the Worker exports no spans)", async () => {
    w = await createWorker(env())
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'
    const res = await send(w, ctx, '/payments/7/capture', { fence: '1', headers: { traceparent, tracestate: 'vendor=abc' } })
    expect(res.status).toBe(200)
    expect(upstream.received[0]!.headers.traceparent).toBe(traceparent)
    expect(upstream.received[0]!.headers.tracestate).toBe('vendor=abc')
    await ctx.settled()
  })

  it('answers a stale fence with 409 and never forwards it', async () => {
    w = await createWorker(env())
    expect((await send(w, ctx, '/payments/42/capture', { fence: '9' })).status).toBe(200)
    const res = await send(w, ctx, '/payments/42/capture', { fence: '8', headers: { 'x-request-id': 'stale-1' } })
    expect(res.status).toBe(409)
    expect(res.json).toMatchObject({ code: 'stale_fence', presented_fence: '8', highest_fence: '9', request_id: 'stale-1' })
    expect(upstream.received.map((r) => r.headers['x-execution-fence'])).toEqual(['9'])
  })

  it('serves the admin plane under /_admin/ only when FENCEGATE_ADMIN is on', async () => {
    w = await createWorker(env({ FENCEGATE_ADMIN: 'on' }))
    await send(w, ctx, '/payments/42/capture', { fence: '9' })
    await send(w, ctx, '/payments/42/capture', { fence: '8', headers: { 'x-request-id': 'stale-2' } })
    const audit = await send(w, ctx, '/_admin/audit?code=stale_fence', { method: 'GET', scope: 'fencegate:admin' })
    expect(audit.status).toBe(200)
    expect(audit.json.items).toMatchObject([{ tenant: 'acme', entity: 'invoice:42', request_id: 'stale-2' }])
    expect((await send(w, ctx, '/_admin/audit', { method: 'GET' })).json.code).toBe('insufficient_scope')
    const health = await w.fetch(new Request('https://gateway.example/_admin/health'), ctx)
    expect(await health.json()).toEqual({ status: 'ok', store: 'up', durability: 'local' })
    await w.close()

    w = await createWorker(env())
    const off = await send(w, ctx, '/_admin/audit', { method: 'GET', scope: 'fencegate:admin' })
    expect(off.status).toBe(404)
    expect(off.json.code).toBe('no_route')
    await ctx.settled()
    expect(await openConnections()).toBe(0)
  })

  it('answers 502 upstream_unreachable when the upstream refuses the connection', async () => {
    w = await createWorker({ ...env(), FENCEGATE_CONFIG: configText(`http://127.0.0.1:${await closedPort()}`) })
    const res = await send(w, ctx, '/payments/1/capture', { fence: '1' })
    expect(res.status).toBe(502)
    expect(res.json.code).toBe('upstream_unreachable')
    expect(res.json.detail).toContain('nothing was sent')
  })

  it('answers 504 upstream_timeout when the upstream does not answer within timeout_ms', async () => {
    upstream.handle(() => {})
    w = await createWorker(env({}, { timeout_ms: 200 }))
    const res = await send(w, ctx, '/payments/1/capture', { fence: '1' })
    expect(res.status).toBe(504)
    expect(res.json.code).toBe('upstream_timeout')
    expect(upstream.received).toHaveLength(1)
  })

  it('stores an idempotent answer after its body ended, before the request store closes', async () => {
    upstream.handle((req, res) => {
      res.writeHead(201, { 'content-type': 'text/plain' })
      res.end(`charged ${req.headers['idempotency-key']}`)
    })
    w = await createWorker(env({}, { idempotency: 'required', idempotency_lock: '30s' }))
    const first = await send(w, ctx, '/payments/7/capture', { fence: '1', headers: { 'idempotency-key': 'k-1' } })
    expect(first).toMatchObject({ status: 201, text: 'charged k-1' })
    const again = await send(w, ctx, '/payments/7/capture', { fence: '1', headers: { 'idempotency-key': 'k-1' } })
    expect(again).toMatchObject({ status: 201, text: 'charged k-1' })
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(upstream.received).toHaveLength(1)
  })

  it('purges expired idempotency records when the Cron Trigger runs', async () => {
    w = await createWorker(env({}, { idempotency: 'required', idempotency_lock: '30s', idempotency_ttl: '1s' }))
    expect((await send(w, ctx, '/payments/9/capture', { fence: '1', headers: { 'idempotency-key': 'k-3' } })).status).toBe(200)
    const count = async () => (await t.db.sql<{ n: number }>`SELECT count(*)::int AS n FROM fg_idempotency`)[0]!.n
    expect(await count()).toBe(1)
    expect(await w.purgeExpired()).toBe(0)
    await new Promise((r) => setTimeout(r, 1100))
    expect(await w.purgeExpired()).toBe(1)
    expect(await count()).toBe(0)
  })

  it('settles an idempotent record whose client left mid-body, then closes the store', async () => {
    const { opened: finished, open: finish } = gate()
    upstream.handle(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain' })
      res.write('first;')
      await finished
      res.end('last')
    })
    w = await createWorker(env({}, { idempotency: 'required', idempotency_lock: '30s' }))
    const headers = { authorization: `Bearer ${await token()}`, 'x-execution-fence': '1', 'idempotency-key': 'k-2' }
    const res = await w.fetch(new Request('https://gateway.example/payments/8/capture', { method: 'POST', headers, body: '{}' }), ctx)
    const reader = res.body!.getReader()
    expect(new TextDecoder().decode((await reader.read()).value)).toBe('first;')
    await reader.cancel()
    // The upstream ends well after the client left: the store must still be open for the record.
    setTimeout(finish, 300)
    await ctx.settled()
    expect(await t.store.getKey('acme', 'k-2')).toMatchObject({ state: 'completed' })
    expect(await openConnections()).toBe(0)
  })

  // Each was forwarded by the Worker before (the raw-target guard was Node's only): Tomcat and
  // Spring read them as /capture or as invoice 42, the gateway fenced another entity.
  it.each([
    ['/payments/..;/capture', 'path parameters'],
    ['/payments/%2e%2e;/capture', 'path parameters'],
    ['/payments/..%3B/capture', 'path parameters'],
    ['/payments/42;x/capture', 'path parameters'],
    ['/payments/%252e%252e/capture', 'double-encoded'],
    ['/payments/42%00/capture', 'NUL'],
    ['/payments/1%2f..%2fadmin/capture', 'encoded slashes'],
    ['/_admin/rules;x', 'path parameters'],
  ])('refuses %s before routing, as the Node gateway does', async (target, reason) => {
    w = await createWorker(env({ FENCEGATE_ADMIN: 'on' }))
    const res = await send(w, ctx, target, { fence: '1' })
    expect([res.status, res.json.code]).toEqual([400, 'invalid_request'])
    expect(res.json.detail).toContain(reason)
    expect(upstream.received).toHaveLength(0)
  })

  it('refuses to start without a database, with an unauthenticated admin plane, or without a public key', async () => {
    await expect(createWorker({ ...env(), DATABASE_URL: undefined, FENCEGATE_CONFIG: configText(upstream.url).replace(/store:\n.*\n/, '') }))
      .rejects.toThrow(/DATABASE_URL/)
    const noAuth = configText(upstream.url).replace(/auth:\n(  .*\n)+/, '')
    await expect(createWorker({ ...env(), FENCEGATE_CONFIG: noAuth, FENCEGATE_ADMIN: 'on' })).rejects.toThrow(/auth.mode: jwt/)
    const publicKey = configText(upstream.url).replace(/hs256_secret: .*/, 'public_keys: [{ file: keys/signer.pem, alg: ES256 }]')
    await expect(createWorker({ ...env(), FENCEGATE_CONFIG: publicKey })).rejects.toThrow(/FENCEGATE_PUBLIC_KEY_0/)
    await expect(createWorker({ ...env(), FENCEGATE_JWT_SECRET: undefined })).rejects.toBeInstanceOf(ConfigError)
    // A route's upstream_tls cannot be honoured by a Worker's fetch: refused, naming the field.
    const tls = env({}, { upstream: 'https://psp.example.com', upstream_tls: { ca_file: 'ca.pem' } })
    await expect(createWorker(tls)).rejects.toThrow(/routes\[0\]\.upstream_tls: not supported on Workers/)
    // Nor can it watch the store's durability between requests: refused, never ignored.
    const replicated = configText(upstream.url).replace('store:\n', 'store:\n  require_replicated: true\n')
    await expect(createWorker({ ...env(), FENCEGATE_CONFIG: replicated })).rejects.toThrow(/store\.require_replicated: not supported on Workers/)
  })

  it('the default export builds once per isolate and answers 500 while misconfigured', async () => {
    const logged = vi.spyOn(console, 'error').mockImplementation(() => {})
    const broken = await worker.fetch(new Request('https://gateway.example/payments/1/capture', { method: 'POST' }), { FENCEGATE_CONFIG: 'routes: []' }, ctx)
    expect(broken.status).toBe(500)
    expect((await broken.json()).code).toBe('internal_error')
    expect(JSON.parse(String(logged.mock.calls[0]![0]))).toMatchObject({ event: 'startup_failed', problems: ['FENCEGATE_CONFIG: routes: at least one route is required'] })
    logged.mockRestore()
    // A failed build is not cached: the next request builds again.
    const good = env()
    const res = await send({ fetch: (request, c) => worker.fetch(request, good, c) }, ctx, '/payments/3/capture', { fence: '2' })
    expect(res.status).toBe(200)
    // Built once: later requests use the first env even when handed another.
    const cached = await send({ fetch: (request, c) => worker.fetch(request, { FENCEGATE_CONFIG: 'routes: []' }, c) }, ctx, '/payments/3/capture', { fence: '3' })
    expect(cached.status).toBe(200)
    // The Cron Trigger purges through the same cached build.
    await t.db.sql`
      INSERT INTO fg_idempotency (tenant, key, fingerprint, route, state, expires_at, owner_token, request_id)
      VALUES ('acme', 'expired', 'f', 'capture', 'completed', now() - interval '1 second', 'o', 'r')`
    await worker.scheduled({}, good, ctx)
    await ctx.settled()
    expect((await t.db.sql<{ n: number }>`SELECT count(*)::int AS n FROM fg_idempotency`)[0]!.n).toBe(0)
    expect(await openConnections()).toBe(0)
  })
})

describe('createFetchForward against a real upstream', () => {
  let upstream: TestUpstream
  beforeEach(async () => {
    upstream = await startUpstream()
  })
  afterEach(async () => {
    await upstream.close()
  })

  const routeTo = (url: string, overrides: Record<string, unknown> = {}) =>
    parseConfig({ routes: [{ name: 'r', method: 'POST', path: '/x', upstream: url, fence: 'off', ...overrides }] }).routes[0]!
  const request = (url: string, init: Partial<ForwardRequest> = {}, overrides: Record<string, unknown> = {}): ForwardRequest => ({
    route: routeTo(url, overrides), target: '/x', method: 'POST', headers: new Headers(), body: null, ...init,
  })
  // The Forward's answer as a Response, to read its body the way a fetch runtime would.
  const fetchForward = createFetchForward()
  const forward = async (r: ForwardRequest) => toResponse(await fetchForward(r))

  it('sends method, base path, target, headers and body, and returns the answer', async () => {
    upstream.handle((req, res) => {
      res.writeHead(201, { 'x-upstream': 'yes', 'content-type': 'text/plain' })
      res.end(`${req.method} ${req.path} ${req.headers['x-client']} ${req.body.toString()}`)
    })
    const res = await forward(request(`${upstream.url}/api/v1`, {
      target: '/orders/1?x=%20y', method: 'PUT', headers: new Headers({ 'x-client': 'c', expect: '100-continue' }), body: new TextEncoder().encode('hello'),
    }))
    expect(res.status).toBe(201)
    expect(res.headers.get('x-upstream')).toBe('yes')
    expect(await res.text()).toBe('PUT /api/v1/orders/1?x=%20y c hello')
    expect(upstream.received[0]!.headers['content-length']).toBe('5')
  })

  it('streams a request body', async () => {
    upstream.handle((req, res) => {
      res.end(req.body.toString())
    })
    const body = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(new TextEncoder().encode('one,'))
        c.enqueue(new TextEncoder().encode('two'))
        c.close()
      },
    })
    const res = await forward(request(upstream.url, { body }))
    expect(await res.text()).toBe('one,two')
    expect(upstream.received[0]!.headers['transfer-encoding']).toBe('chunked')
  })

  it('returns redirects instead of following them', async () => {
    upstream.handle((_req, res) => {
      res.writeHead(302, { location: '/elsewhere' })
      res.end()
    })
    const res = await forward(request(upstream.url))
    expect(res.status).toBe(302)
    expect(res.headers.get('location')).toBe('/elsewhere')
    expect(upstream.received).toHaveLength(1)
  })

  it('returns a gzip body decoded, without the headers that described the encoded bytes', async () => {
    const body = JSON.stringify({ pad: 'x'.repeat(1000) })
    upstream.handle((_req, res) => {
      const gz = gzipSync(body)
      res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip', 'content-length': gz.length })
      res.end(gz)
    })
    const res = await forward(request(upstream.url, { headers: new Headers({ 'accept-encoding': 'zstd, br' }) }))
    expect(upstream.received[0]!.headers['accept-encoding']).toBe('gzip')
    expect(res.headers.get('content-encoding')).toBeNull()
    expect(res.headers.get('content-length')).toBeNull()
    expect(await res.text()).toBe(body)
  })

  it('passes a body in a coding fetch does not decode through untouched', async () => {
    // `compress`, which no fetch decodes: Node 26's fetch decodes zstd (Node 20's and 22's do not).
    upstream.handle((_req, res) => {
      res.writeHead(200, { 'content-encoding': 'compress', 'content-length': 3 })
      res.end('abc')
    })
    const res = await forward(request(upstream.url))
    expect(res.headers.get('content-encoding')).toBe('compress')
    expect(res.headers.get('content-length')).toBe('3')
    expect(await res.text()).toBe('abc')
  })

  it('answers HEAD and 204 with no body', async () => {
    upstream.handle((_req, res) => {
      res.writeHead(204)
      res.end()
    })
    expect((await forward(request(upstream.url))).body).toBeNull()
    upstream.handle((_req, res) => {
      res.writeHead(200, { 'content-length': 10 })
      res.end()
    })
    const head = await forward(request(upstream.url, { method: 'HEAD' }))
    expect(head.status).toBe(200)
    expect(await head.text()).toBe('')
    await expect(forward(request(upstream.url, { method: 'GET', body: new TextEncoder().encode('x') }))).rejects.toMatchObject({ kind: 'unreachable', sent: false })
  })

  it('reports a refused connection as unreachable and not sent', async () => {
    const err = await forward(request(`http://127.0.0.1:${await closedPort()}`)).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(ForwardError)
    expect(err).toMatchObject({ kind: 'unreachable', sent: false })
  })

  it('reports missing headers after timeout_ms as a timeout that may have been sent', async () => {
    upstream.handle(() => {})
    const started = Date.now()
    await expect(forward(request(upstream.url, {}, { timeout_ms: 150 }))).rejects.toMatchObject({ kind: 'timeout', sent: true })
    expect(Date.now() - started).toBeLessThan(2000)
    expect(upstream.received).toHaveLength(1)
  })

  it('fails a body that stalls for timeout_ms, but not one that keeps arriving', async () => {
    upstream.handle(async (_req, res) => {
      res.writeHead(200)
      for (let i = 0; i < 4; i++) {
        res.write(`${i};`)
        await new Promise((r) => setTimeout(r, 100))
      }
      res.end()
    })
    // Slower in total than timeout_ms, but no single wait is.
    expect(await (await forward(request(upstream.url, {}, { timeout_ms: 250 }))).text()).toBe('0;1;2;3;')
    upstream.handle((_req, res) => {
      res.writeHead(200)
      res.write('first;')
    })
    const res = await forward(request(upstream.url, {}, { timeout_ms: 200 }))
    await expect(res.text()).rejects.toThrow()
  })

  it('reports a connection reset after the request went as reset and possibly sent', async () => {
    const server = createServer((req) => req.on('data', () => {}).on('end', () => req.socket.destroy()))
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    try {
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
      await expect(forward(request(url, { body: new TextEncoder().encode('{}') }))).rejects.toMatchObject({ kind: 'reset', sent: true })
    } finally {
      await new Promise((resolve) => server.close(resolve))
    }
  })

  it('uses an injected fetch', async () => {
    const seen: string[] = []
    const custom = createFetchForward({ fetch: (input, init) => (seen.push(String(input)), fetch(input, init)) })
    expect((await custom(request(`${upstream.url}/base`, { target: '/t?q=1' }))).status).toBe(200)
    expect(seen).toEqual([`${upstream.url}/base/t?q=1`])
  })
})
