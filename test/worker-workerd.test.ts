import { exportPKCS8, exportSPKI, generateKeyPair, SignJWT } from 'jose'
import type { Miniflare } from 'miniflare'
import { connect, createServer, type AddressInfo, type Server } from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import pg from 'postgres'
import { verifyAttestation } from '../src/verify/index.js'
import { backends, type TestDb } from './helpers/backends.js'
import { audience, issuer, secret, token } from './helpers/tokens.js'
import { closedPort, gate, startUpstream, type TestUpstream } from './helpers/upstream.js'
import { bundleWorker, startWorkerd, workerOf } from './helpers/workerd.js'

/*
 * The Worker as deployed: bundled by wrangler, run by workerd (Miniflare),
 * against the test PostgreSQL through Cloudflare's sockets and a real upstream
 * on loopback through workerd's fetch. One workerd per file; every test uses
 * its own entities and keys on one database.
 */
const postgres = backends().find((b) => b.name === 'postgres')
if (!postgres) console.warn('test/worker-workerd.test.ts skipped: DATABASE_URL is not set (the Worker has no embedded store)')

function configText(upstream: string, refused: string): string {
  const route = (fields: Record<string, unknown>) => `  - ${Object.entries(fields).map(([k, v]) => `${k}: ${JSON.stringify(v)}`).join('\n    ')}`
  return [
    'auth:',
    '  mode: jwt',
    `  issuer: ${issuer}`,
    `  audience: ${audience}`,
    '  hs256_secret: ${FENCEGATE_JWT_SECRET}',
    'store:',
    '  url: ${DATABASE_URL}',
    'log:',
    '  level: silent',
    'attestation:',
    '  key_file: attest.pem',
    '  alg: ES256',
    '  kid: gw-1',
    'job_types:',
    '  - name: report',
    '    lease: 20s',
    'routes:',
    route({ name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream, entity: 'invoice:{params.id}', timeout_ms: 5000 }),
    route({ name: 'charge', method: 'POST', path: '/charges/:id', upstream, entity: 'charge:{params.id}', idempotency: 'required', idempotency_wait: '10s', timeout_ms: 5000 }),
    route({ name: 'hold', method: 'POST', path: '/holds/:id', upstream, entity: 'hold:{params.id}', idempotency: 'required', timeout_ms: 5000, idempotency_wait: 0 }),
    route({ name: 'slow', method: 'POST', path: '/slow/:id', upstream, entity: 'slow:{params.id}', timeout_ms: 300 }),
    route({ name: 'refused', method: 'POST', path: '/refused/:id', upstream: refused, entity: 'refused:{params.id}', timeout_ms: 5000, idempotency: 'optional' }),
    route({ name: 'attested', method: 'POST', path: '/attested/:id', upstream, entity: 'attested:{params.id}', attest: true }),
    route({ name: 'ordered', method: 'POST', path: '/ordered/:id', upstream, entity: 'ordered:{params.id}', ordering: 'serialize', ordering_wait: '30s' }),
    route({ name: 'step', method: 'POST', path: '/steps/:name', upstream, fence: 'lease', entity: 'job:{header.X-Job-Id}' }),
  ].join('\n')
}

/** A TCP relay to PostgreSQL that keeps what clients sent, per connection. */
async function startSniffer(target: URL): Promise<{ port: number; sent: string[]; close(): Promise<void> }> {
  const sent: string[] = []
  const server: Server = createServer((client) => {
    const i = sent.push('') - 1
    const upstream = connect(Number(target.port || 5432), target.hostname)
    client.on('data', (chunk: Buffer) => {
      sent[i] += chunk.toString('latin1')
      upstream.write(chunk)
    })
    upstream.on('data', (chunk: Buffer) => client.write(chunk))
    client.on('close', () => upstream.end())
    upstream.on('close', () => client.destroy())
    client.on('error', () => undefined)
    upstream.on('error', () => undefined)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    port: (server.address() as AddressInfo).port,
    sent,
    close: () => new Promise((resolve) => {
      server.close(() => resolve())
    }),
  }
}

/** Miniflare's Hyperdrive wants a password in the URL; the test server trusts loopback and never asks for it. */
function withPassword(url: string): string {
  const u = new URL(url)
  u.password ||= 'unused'
  return u.toString()
}

describe.skipIf(!postgres)('the Worker in workerd on PostgreSQL', () => {
  let t: TestDb
  let upstream: TestUpstream
  let mf: Miniflare
  let sniffer: Awaited<ReturnType<typeof startSniffer>>
  let sniffedUrl: string
  /** Requests to hold at the upstream until the test opens the gate, by path. */
  const held = new Map<string, Promise<void>>()
  const ordered = { arrivals: [] as string[], inFlight: 0, maxInFlight: 0 }
  let keys: { privatePem: string; publicPem: string }
  let es256: CryptoKey

  beforeAll(async () => {
    t = await postgres!.open()
    upstream = await startUpstream(async (req, res) => {
      if (req.path.startsWith('/slow/')) return // never answers
      if (req.path.startsWith('/ordered/')) {
        ordered.arrivals.push(String(req.headers['x-execution-fence']))
        ordered.inFlight++
        ordered.maxInFlight = Math.max(ordered.maxInFlight, ordered.inFlight)
        // Slow enough that unordered deliveries would overlap.
        await new Promise((resolve) => setTimeout(resolve, 20))
        ordered.inFlight--
      }
      await held.get(req.path)
      if (req.path.startsWith('/charges/') || req.path.startsWith('/holds/')) {
        res.writeHead(201, { 'content-type': 'text/plain' })
        res.end(`charged ${req.headers['idempotency-key']}`)
        return
      }
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ path: req.path, fence: req.headers['x-execution-fence'] ?? null }))
    })
    const config = configText(upstream.url, `http://127.0.0.1:${await closedPort()}`)
    const pair = await generateKeyPair('ES256', { extractable: true })
    keys = { privatePem: await exportPKCS8(pair.privateKey), publicPem: await exportSPKI(pair.publicKey) }
    const common = { FENCEGATE_CONFIG: config, FENCEGATE_JWT_SECRET: secret, FENCEGATE_ATTESTATION_KEY: keys.privatePem }
    const signer = await generateKeyPair('ES256', { extractable: true })
    es256 = signer.privateKey
    const publicKeyConfig = config.replace('  hs256_secret: ${FENCEGATE_JWT_SECRET}', '  public_keys:\n    - file: signer.pem\n      alg: ES256')
    sniffer = await startSniffer(new URL(t.url!))
    const sniffed = new URL(t.url!)
    sniffed.port = String(sniffer.port)
    sniffedUrl = sniffed.toString()
    mf = await startWorkerd(await bundleWorker(), [
      { name: 'gateway', bindings: { ...common, DATABASE_URL: t.url!, FENCEGATE_ADMIN: 'on' } },
      // The same Worker whose database refuses connections.
      // The same Worker reaching the database through a Hyperdrive binding, as wrangler dev does with
      // localConnectionString; its DATABASE_URL leads nowhere, so only the binding can work.
      { name: 'hyperdrive', bindings: { ...common, DATABASE_URL: `postgres://postgres@127.0.0.1:${await closedPort()}/nowhere` }, hyperdrives: { HYPERDRIVE: withPassword(t.url!) } },
      // The same Worker verifying ES256 tokens with a public key from a binding.
      { name: 'es256', bindings: { ...common, FENCEGATE_CONFIG: publicKeyConfig, DATABASE_URL: t.url!, FENCEGATE_PUBLIC_KEY_0: await exportSPKI(signer.publicKey) } },
      // The same Worker, checking the rules' version on every request.
      { name: 'watching', bindings: { ...common, DATABASE_URL: t.url!, FENCEGATE_RULES_CHECK_MS: '0' } },
      // The same Worker whose database connections pass a relay that keeps what the Worker sent.
      { name: 'sniffed', bindings: { ...common, DATABASE_URL: sniffedUrl } },
      { name: 'storeless', bindings: { ...common, DATABASE_URL: `postgres://postgres@127.0.0.1:${await closedPort()}/nowhere` } },
    ])
  }, 120_000)
  afterAll(async () => {
    await mf?.dispose()
    await sniffer?.close()
    await upstream?.close()
    await t?.close()
  })

  async function send(path: string, init: { fence?: string; key?: string; method?: string; body?: string; token?: string | null; scope?: string; worker?: string; headers?: Record<string, string> } = {}) {
    const headers: Record<string, string> = { ...init.headers }
    const bearer = init.token === undefined ? await token(init.scope ? { scope: init.scope } : {}) : init.token
    if (bearer !== null) headers.authorization = `Bearer ${bearer}`
    if (init.fence !== undefined) headers['x-execution-fence'] = init.fence
    if (init.key !== undefined) headers['idempotency-key'] = init.key
    const method = init.method ?? 'POST'
    const request = { method, headers, body: method === 'GET' ? null : (init.body ?? '{}') }
    const url = `https://gateway.example${path}`
    const res = init.worker ? await (await workerOf(mf, init.worker)).fetch(url, request) : await mf.dispatchFetch(url, request)
    const text = await res.text()
    let json: any
    try {
      json = JSON.parse(text)
    } catch {}
    return { status: res.status, headers: res.headers, text, json }
  }
  const arrivedAt = (prefix: string) => upstream.received.filter((r) => r.path.startsWith(prefix))

  it('accepts a fenced command, forwards it and records the fence', async () => {
    const res = await send('/payments/1/capture?mode=full', { fence: '5', body: '{"amount":1299}' })
    expect(res.status).toBe(200)
    expect(res.json).toEqual({ path: '/payments/1/capture?mode=full', fence: '5' })
    const [received] = arrivedAt('/payments/1/')
    expect(received!.body.toString()).toBe('{"amount":1299}')
    expect(received!.headers.authorization).toBeUndefined()
    expect(await t.store.getEntity('acme', 'invoice:1')).toMatchObject({ highest_fence: '5' })
  })

  it('answers a stale fence with 409 and never forwards it', async () => {
    expect((await send('/payments/2/capture', { fence: '9' })).status).toBe(200)
    const res = await send('/payments/2/capture', { fence: '8' })
    expect(res.status).toBe(409)
    expect(res.json).toMatchObject({ code: 'stale_fence', presented_fence: '8', highest_fence: '9' })
    expect(arrivedAt('/payments/2/').map((r) => r.headers['x-execution-fence'])).toEqual(['9'])
  })

  it('answers a missing fence with 428 and an invalid one with 400', async () => {
    expect((await send('/payments/3/capture')).json).toMatchObject({ status: 428, code: 'fence_required' })
    expect((await send('/payments/3/capture', { fence: 'seven' })).json).toMatchObject({ status: 400, code: 'invalid_fence' })
    expect(arrivedAt('/payments/3/')).toHaveLength(0)
  })

  it('authenticates with HS256 JWTs: no token and a forged one are 401, the tenant comes from the token', async () => {
    expect((await send('/payments/4/capture', { fence: '1', token: null })).json).toMatchObject({ status: 401, code: 'unauthenticated' })
    const forged = await token({}, { key: new TextEncoder().encode('another-secret-of-at-least-32-bytes!') })
    expect((await send('/payments/4/capture', { fence: '1', token: forged })).json).toMatchObject({ status: 401, code: 'unauthenticated' })
    expect(arrivedAt('/payments/4/')).toHaveLength(0)
    const globex = await token({ tenant_id: 'globex' })
    expect((await send('/payments/4/capture', { fence: '1', token: globex })).status).toBe(200)
    expect(await t.store.getEntity('globex', 'invoice:4')).toMatchObject({ highest_fence: '1' })
    expect(await t.store.getEntity('acme', 'invoice:4')).toBeUndefined()
  })

  it('replays an idempotent answer: the upstream ran once', async () => {
    const first = await send('/charges/1', { fence: '1', key: 'charge-1' })
    expect(first).toMatchObject({ status: 201, text: 'charged charge-1' })
    // idempotency_wait lets the duplicate wait for the first's record, which the Worker writes after the body ended.
    const again = await send('/charges/1', { fence: '1', key: 'charge-1' })
    expect(again).toMatchObject({ status: 201, text: 'charged charge-1' })
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(arrivedAt('/charges/1')).toHaveLength(1)
    expect(await t.store.getKey('acme', 'charge-1')).toMatchObject({ state: 'completed' })
  })

  it('answers 409 request_in_progress to a duplicate of a command still in flight', async () => {
    const { opened, open } = gate()
    held.set('/holds/1', opened)
    const first = send('/holds/1', { fence: '1', key: 'hold-1' })
    await upstream.arrived(upstream.received.length + 1)
    const duplicate = await send('/holds/1', { fence: '1', key: 'hold-1' })
    expect(duplicate.json).toMatchObject({ status: 409, code: 'request_in_progress' })
    open()
    expect(await first).toMatchObject({ status: 201, text: 'charged hold-1' })
    expect(arrivedAt('/holds/1')).toHaveLength(1)
  })

  it('answers 503 store_unavailable and forwards nothing when the database refuses connections', async () => {
    const res = await send('/payments/5/capture', { fence: '1', worker: 'storeless' })
    expect(res.json).toMatchObject({ status: 503, code: 'store_unavailable' })
    expect(arrivedAt('/payments/5/')).toHaveLength(0)
  })

  it('answers 504 upstream_timeout when the upstream does not answer within timeout_ms', async () => {
    const res = await send('/slow/1', { fence: '1' })
    expect(res.json).toMatchObject({ status: 504, code: 'upstream_timeout' })
    expect(arrivedAt('/slow/1')).toHaveLength(1)
  })

  it('answers 502 for a refused upstream, as possibly sent: workerd fetch errors carry no reason', async () => {
    const res = await send('/refused/1', { fence: '1', key: 'refused-1' })
    expect(res.json).toMatchObject({ status: 502, code: 'upstream_unreachable' })
    expect(res.json.detail).not.toContain('nothing was sent')
    // So the key is not freed for a retry that might charge twice: it waits for an operator.
    expect(await t.store.getKey('acme', 'refused-1')).toMatchObject({ state: 'outcome_unknown' })
  })

  it('verifies ES256 tokens with a public key from FENCEGATE_PUBLIC_KEY_0, and refuses HS256 ones there', async () => {
    const signed = await new SignJWT({ tenant_id: 'acme', sub: 'worker-1' }).setProtectedHeader({ alg: 'ES256' })
      .setIssuer(issuer).setAudience(audience).setIssuedAt().setExpirationTime('5m').sign(es256)
    expect((await send('/payments/96/capture', { fence: '1', token: signed, worker: 'es256' })).status).toBe(200)
    expect((await send('/payments/96/capture', { fence: '2', worker: 'es256' })).json).toMatchObject({ status: 401, code: 'unauthenticated' })
    expect(arrivedAt('/payments/96/')).toHaveLength(1)
  })

  it('serves the admin plane under /_admin/ with its scopes', async () => {
    await send('/payments/6/capture', { fence: '3' })
    expect((await send('/payments/6/capture', { fence: '2' })).status).toBe(409)
    const audit = await send('/_admin/audit?code=stale_fence&entity=invoice:6', { method: 'GET', scope: 'fencegate:admin' })
    expect(audit.status).toBe(200)
    expect(audit.json.items).toMatchObject([{ tenant: 'acme', entity: 'invoice:6', code: 'stale_fence' }])
    const entity = await send('/_admin/entities/invoice:6', { method: 'GET', scope: 'fencegate:admin' })
    expect(entity.json).toMatchObject({ entity: 'invoice:6', highest_fence: '3' })
    expect((await send('/_admin/audit', { method: 'GET' })).json).toMatchObject({ status: 403, code: 'insufficient_scope' })
    expect((await send('/_admin/health', { method: 'GET', token: null })).json).toEqual({ status: 'ok', store: 'up', durability: 'local' })
    // No metrics on Workers: there is no process to keep counters in between requests.
    expect((await send('/_admin/metrics', { method: 'GET', scope: 'fencegate:admin' })).json).toMatchObject({ status: 404, code: 'not_found' })
  })

  it('purges expired idempotency records when the Cron Trigger runs', async () => {
    await t.db.sql`
      INSERT INTO fg_idempotency (tenant, key, fingerprint, route, state, expires_at, owner_token, request_id)
      VALUES ('acme', 'expired-1', 'f', 'charge', 'completed', now() - interval '1 second', 'o', 'r')`
    const expired = async () => (await t.db.sql<{ n: number }>`SELECT count(*)::int AS n FROM fg_idempotency WHERE expires_at < now()`)[0]!.n
    expect(await expired()).toBe(1)
    const result = await (await workerOf(mf)).scheduled({ cron: '* * * * *', scheduledTime: new Date() })
    expect(result.outcome).toBe('ok')
    expect(await expired()).toBe(0)
  })

  it('opens one connection per request and sends no catalog query on it (fetch_types: false)', async () => {
    // The control: postgres.js's default looks up the array types on every new connection
    // (the Node gateway turns it off too, src/store/postgres.ts).
    const nodeDefault = pg(sniffedUrl, { max: 1, onnotice: () => {} })
    await nodeDefault`SELECT 1`
    await nodeDefault.end()
    expect(sniffer.sent).toHaveLength(1)
    expect(sniffer.sent[0]).toContain('pg_catalog.pg_type')

    expect((await send('/payments/7/capture', { fence: '1', worker: 'sniffed' })).status).toBe(200)
    expect((await send('/payments/7/capture', { fence: '2', worker: 'sniffed' })).status).toBe(200)
    expect(sniffer.sent).toHaveLength(3)
    for (const sent of sniffer.sent.slice(1)) {
      expect(sent).toContain('fg_')
      expect(sent).not.toContain('pg_type')
    }
  })

  it('signs a Fence-Attestation the upstream verifies against the request it received', async () => {
    expect((await send('/attested/1', { fence: '4', body: '{"amount":5}' })).status).toBe(200)
    const [received] = arrivedAt('/attested/1')
    const claims = await verifyAttestation(received!.headers['fence-attestation'] as string, {
      key: keys.publicPem,
      audience: upstream.url,
      request: { method: received!.method, path: received!.path, body: received!.body, fence: '4', idempotencyKey: null },
    })
    expect(claims).toMatchObject({ fence: '4', entity: 'attested:1', tenant: 'acme' })
  })

  it('delivers an ordered route one command at a time per entity, in non-decreasing fence order', async () => {
    const fences = Array.from({ length: 12 }, (_, i) => String(1 + ((i * 5) % 6)))
    const answers = await Promise.all(fences.map((fence) => send('/ordered/1', { fence })))
    expect(ordered.maxInFlight).toBe(1)
    expect(answers.filter((a) => a.status === 200)).toHaveLength(ordered.arrivals.length)
    for (const a of answers.filter((x) => x.status !== 200)) expect(a.json.code).toBe('stale_fence')
    for (let i = 1; i < ordered.arrivals.length; i++) expect(Number(ordered.arrivals[i]) >= Number(ordered.arrivals[i - 1])).toBe(true)
    expect(ordered.arrivals.at(-1)).toBe('6')
  })

  it('serves the job API: start, claim, heartbeat, a lease-fenced step, append, complete; with the scopes and the worker from the token', async () => {
    const jobs = '/_fencegate/jobs'
    // The token's sub (worker-1) is the worker; worker-1/b is another slot of it.
    const scope = 'jobs:start jobs:work jobs:read'
    const post = (path: string, body: unknown, as = scope) => send(`${jobs}${path}`, { scope: as, body: JSON.stringify(body), headers: { 'content-type': 'application/json' } })
    expect((await post('', { type: 'report', key: 'report-1' }, 'jobs:read')).json).toMatchObject({ status: 403, code: 'insufficient_scope' })
    const started = await post('', { type: 'report', key: 'report-1', payload: { month: 11 } })
    expect(started).toMatchObject({ status: 201, json: { state: 'queued', created: true } })
    const id = started.json.job_id as string
    expect((await post('/claim', { worker_id: 'worker-2' })).json).toMatchObject({ status: 403, code: 'worker_mismatch' })
    const claimed = await post('/claim', { worker_id: 'worker-1' })
    expect(claimed.json).toMatchObject({ job_id: id, fence: '1', attempt: 1, payload: { month: 11 }, worker_id: 'worker-1' })
    // Nothing else to claim: a waiting claim polls (no LISTEN on Workers) until its wait ends.
    expect((await post('/claim', { worker_id: 'worker-1/b', wait: 1 })).status).toBe(204)
    expect((await post(`/${id}/heartbeat`, { worker_id: 'worker-1', fence: '1' })).json).toMatchObject({ cancel_requested: false })
    expect((await send('/steps/render', { fence: '1', headers: { 'x-job-id': id } })).status).toBe(200)
    expect((await send('/steps/render', { fence: '2', headers: { 'x-job-id': id } })).json).toMatchObject({ status: 409 })
    expect((await post(`/${id}/append`, { worker_id: 'worker-1', fence: '1', seq: 0, chunk: { rows: 3 } })).json).toEqual({ seq: 0, cursor_length: 1 })
    expect((await post(`/${id}/complete`, { worker_id: 'worker-1/b', fence: '1', result: {} })).json).toMatchObject({ status: 409, code: 'not_owner' })
    expect((await post(`/${id}/complete`, { worker_id: 'worker-2', fence: '1', result: {} })).json).toMatchObject({ status: 403, code: 'worker_mismatch' })
    expect((await post(`/${id}/complete`, { worker_id: 'worker-1', fence: '1', result: { rows: 3 } })).json).toEqual({ job_id: id, state: 'succeeded' })
    expect((await send(`${jobs}/${id}`, { method: 'GET', scope })).json).toMatchObject({ state: 'succeeded', result: { rows: 3 }, cursor_length: 1 })
  })

  it('takes its rules from the database, seeded from FENCEGATE_CONFIG, and lists them under /_admin/rules', async () => {
    const listed = await send('/_admin/rules', { method: 'GET', scope: 'fencegate:admin' })
    expect(listed.status).toBe(200)
    expect(listed.json.version).toBeGreaterThan(0)
    expect(listed.json.rules.map((r: { name: string }) => r.name)).toEqual(expect.arrayContaining(['capture', 'charge', 'ordered']))
    expect(listed.headers.get('etag')).toBe(`"${listed.json.version}"`)
  })

  it('applies a rule changed through its own admin plane at once, and another isolate sees it on its next check', async () => {
    expect((await send('/payments/90/capture', { fence: '1', worker: 'watching' })).status).toBe(200)
    const put = await send('/_admin/rules/freeze-90', { method: 'PUT', scope: 'fencegate:admin', body: '{"entity_match": "invoice:90", "frozen": true}', headers: { 'content-type': 'application/json' } })
    expect(put.json).toMatchObject({ name: 'freeze-90', changed: true })
    // The isolate that made the change uses it for its next request.
    expect((await send('/payments/90/capture', { fence: '2' })).json).toMatchObject({ status: 423, code: 'entity_frozen' })
    // Another isolate (FENCEGATE_RULES_CHECK_MS=0: it checks the version on every request) sees it on its next request.
    expect((await send('/payments/90/capture', { fence: '2', worker: 'watching' })).json).toMatchObject({ status: 423, code: 'entity_frozen' })
    expect((await send('/_admin/rules/freeze-90', { method: 'DELETE', scope: 'fencegate:admin' })).json).toMatchObject({ deleted: true })
    expect((await send('/payments/90/capture', { fence: '2', worker: 'watching' })).status).toBe(200)
    expect(arrivedAt('/payments/90/').map((r) => r.headers['x-execution-fence'])).toEqual(['1', '2'])
  })

  it('reaches the database through a Hyperdrive binding before DATABASE_URL', async () => {
    expect((await send('/payments/95/capture', { fence: '3', worker: 'hyperdrive' })).status).toBe(200)
    expect((await send('/payments/95/capture', { fence: '2', worker: 'hyperdrive' })).json).toMatchObject({ status: 409, code: 'stale_fence' })
    expect(await t.store.getEntity('acme', 'invoice:95')).toMatchObject({ highest_fence: '3' })
  })
})
