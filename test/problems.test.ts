import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createAdminApp } from '../src/admin/app.js'
import { createApp } from '../src/gateway/app.js'
import { createUndiciForward } from '../src/runtime/node/forward.js'
import { FencegateError, problemCatalog, problemResponse, type ClientErrorType, type ProblemCode } from '../src/http/problems.js'
import { problemMediaType, type ErrorEnvelope } from '../src/http/envelopes.js'
import { fingerprint } from '../src/gateway/idempotency.js'
import { browserGuard } from '../src/http/browser-guard.js'
import { createJobStore } from '../src/leases/store.js'
import { createClaimWake, type ClaimWake } from '../src/leases/wake.js'
import { silentLogger } from '../src/observe/log.js'
import { startRuleRegistry, type RuleRegistry } from '../src/rules/registry.js'
import type { Db } from '../src/store/db.js'
import { createStore, type Command, type Store } from '../src/store/store.js'
import { DurabilityRefusal, localDurability, type DurabilityRefusalCode } from '../src/store/durability.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, testConfig } from './helpers/gateway.js'
import { hmacAuthenticator, jwtAuth, token } from './helpers/tokens.js'
import { closedPort, startUpstream, type TestUpstream } from './helpers/upstream.js'
import { makeTestPki, type TestPki } from './helpers/tls.js'

type Apps = { capped: { app: ReturnType<typeof createApp>; wake: ClaimWake }; guarded: ReturnType<typeof createApp>; guardedAdmin: ReturnType<typeof createAdminApp>; refusing: (code: DurabilityRefusalCode) => ReturnType<typeof createApp>; db: Db; store: Store; authData: ReturnType<typeof createApp>; data: ReturnType<typeof createApp>; admin: ReturnType<typeof createAdminApp>; brokenData: ReturnType<typeof createApp>; faultyData: ReturnType<typeof createApp> }
const keyed = (key: string): RequestInit => ({ method: 'POST', body: '{}', headers: { 'x-execution-fence': '1', 'idempotency-key': key } })
const claimOf = (key: string, fp: string): Command => ({
  tenant: 'default', route: 'keyed', entity: null, fence: null, method: 'POST', path: '/keyed/1', bodySha256: null, caller: null, requestId: key,
  idempotency: { key, fingerprint: fp, ownerToken: 'test', lockMs: 60_000, ttlMs: 60_000, retryUnknown: false },
})
const withToken = (jwt: string, extra: Record<string, string> = {}): RequestInit => ({ method: 'POST', body: '{}', headers: { 'x-execution-fence': '1', authorization: `Bearer ${jwt}`, ...extra } })
const json = (body: unknown): RequestInit => ({ method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json' } })
/** Starts and claims a job as worker `w`, then runs `then` with its id and fence. */
async function claimed(data: Apps['data'], key: string, then: (id: string, fence: string) => Response | Promise<Response>): Promise<Response> {
  await data.request('/_fencegate/jobs', json({ type: 'report', key }))
  const claim = await (await data.request('/_fencegate/jobs/claim', json({ worker_id: 'w' }))).json() as { job_id: string; fence: string }
  return then(claim.job_id, claim.fence)
}
const fenced = (fence?: string, body = '{}'): RequestInit => ({ method: 'POST', body, headers: fence === undefined ? {} : { 'x-execution-fence': fence } })

/** How to provoke each code through the real apps; every code in the catalog must appear here. */
const triggers: Record<ProblemCode, (apps: Apps) => Response | Promise<Response>> = {
  no_route: ({ data }) => data.request('/nowhere', fenced('1')),
  invalid_request: ({ data }) => data.request('/payments/%E0%A4%A/capture', fenced('1')),
  unauthenticated: ({ authData }) => authData.request('/payments/1/capture', fenced('1')),
  tenant_missing: async ({ authData }) => authData.request('/payments/1/capture', withToken(await token({ tenant_id: undefined }))),
  tenant_mismatch: async ({ authData }) => authData.request('/claimed/1', withToken(await token(), { 'x-tenant-id': 'globex' })),
  insufficient_scope: async ({ authData }) => authData.request('/scoped/1', withToken(await token({ scope: 'other' }))),
  worker_mismatch: async ({ authData }) => authData.request('/_fencegate/jobs/claim', { method: 'POST', body: JSON.stringify({ worker_id: 'someone-else' }), headers: { 'content-type': 'application/json', authorization: `Bearer ${await token({ scope: 'jobs:work' })}` } }),
  invalid_fence: ({ data }) => data.request('/payments/1/capture', fenced('0x10')),
  fence_required: ({ data }) => data.request('/payments/1/capture', fenced()),
  entity_unresolved: ({ data }) => data.request('/tickets', fenced('1', '{"no_ticket":true}')),
  unreadable_body: ({ data }) => data.request('/tickets', fenced('1', '{"ticket":"T1",}')),
  stale_fence: async ({ data }) => {
    await data.request('/payments/2/capture', fenced('10'))
    return data.request('/payments/2/capture', fenced('9'))
  },
  body_too_large: ({ data }) => data.request('/payments/1/capture', fenced('1', 'x'.repeat(2048))),
  invalid_idempotency_key: ({ data }) => data.request('/keyed/1', keyed('""')),
  idempotency_key_required: ({ data }) => data.request('/keyed/1', fenced('1')),
  request_in_progress: async ({ data, store }) => {
    await store.reserve(claimOf('in-progress', await fingerprint('POST', 'keyed', '/keyed/1', '', new TextEncoder().encode('{}'))))
    return data.request('/keyed/1', keyed('in-progress'))
  },
  idempotency_key_reused: async ({ data, store }) => {
    await store.reserve(claimOf('reused', 'another payload'))
    return data.request('/keyed/1', keyed('reused'))
  },
  response_not_replayable: async ({ data }) => {
    // The record settles when the answer has been streamed, so read it first.
    await (await data.request('/tiny/1', keyed('big-answer'))).text()
    return data.request('/tiny/1', keyed('big-answer'))
  },
  outcome_unknown: async ({ data }) => {
    await data.request('/slow-keyed/1', keyed('lost'))
    return data.request('/slow-keyed/1', keyed('lost'))
  },
  key_not_releasable: async ({ data, admin }) => {
    await (await data.request('/keyed/1', keyed('done'))).text()
    return admin.request('/idempotency/done', { method: 'DELETE' })
  },
  upstream_unreachable: ({ data }) => data.request('/refused/1', fenced('1')),
  upstream_timeout: ({ data }) => data.request('/slow/1', fenced('1')),
  // An https upstream whose certificate no CA the gateway trusts signed (test/upstream-tls.test.ts has the rest).
  upstream_tls_failed: ({ data }) => data.request('/untrusted/1', fenced('1')),
  store_unavailable: ({ brokenData }) => brokenData.request('/payments/1/capture', fenced('1')),
  // The refusals themselves are made by real replicated clusters in test/failover.test.ts.
  store_not_replicated: ({ refusing }) => refusing('store_not_replicated').request('/payments/1/capture', fenced('1')),
  store_identity_changed: ({ refusing }) => refusing('store_identity_changed').request('/payments/1/capture', fenced('1')),
  store_lost_commits: ({ refusing }) => refusing('store_lost_commits').request('/payments/1/capture', fenced('1')),
  unknown_job_type: ({ data }) => data.request('/_fencegate/jobs', json({ type: 'nope', key: 'k' })),
  job_not_found: ({ data }) => data.request('/_fencegate/jobs/999999'),
  job_finished: async ({ data }) => {
    const { job_id } = await (await data.request('/_fencegate/jobs', json({ type: 'report', key: 'finished' }))).json() as { job_id: string }
    await data.request(`/_fencegate/jobs/${job_id}/cancel`, { method: 'POST' })
    return data.request('/_fencegate/jobs', json({ type: 'report', key: 'finished' }))
  },
  // Operator actions (test/admin-jobs.test.ts has the rest): a queued job has no lease to end and has not finished.
  job_not_running: async ({ data, admin }) => {
    const { job_id } = await (await data.request('/_fencegate/jobs', json({ type: 'report', key: 'never-claimed' }))).json() as { job_id: string }
    return admin.request(`/jobs/${job_id}/release`, { method: 'POST' })
  },
  // One claim waits (the tenant's cap is 1 here), so a second waiting claim is refused; test/leases-wait-shared.test.ts has the rest.
  too_many_waiting_claims: async ({ capped }) => {
    const leaving = new AbortController()
    const first = Promise.resolve(capped.app.request('/_fencegate/jobs/claim', { ...json({ worker_id: 'w1', types: ['idle'], wait: 30 }), signal: leaving.signal }))
    let answered = false
    void first.then(() => (answered = true))
    while (capped.wake.stats().waiting < 1) {
      if (answered) throw new Error('the first claim answered instead of waiting')
      await new Promise((resolve) => setTimeout(resolve, 5))
    }
    const refused = await capped.app.request('/_fencegate/jobs/claim', json({ worker_id: 'w2', types: ['idle'], wait: 1 }))
    leaving.abort()
    expect((await first).status).toBe(204)
    return refused
  },
  job_not_retryable: async ({ data, admin }) => {
    const { job_id } = await (await data.request('/_fencegate/jobs', json({ type: 'report', key: 'still-queued' }))).json() as { job_id: string }
    return admin.request(`/jobs/${job_id}/retry`, { method: 'POST' })
  },
  lease_lost: ({ data }) => claimed(data, 'lost', (id) => data.request(`/_fencegate/jobs/${id}/heartbeat`, json({ worker_id: 'someone-else', fence: '1' }))),
  not_owner: ({ data }) => claimed(data, 'owner', (id) => data.request(`/_fencegate/jobs/${id}/complete`, json({ worker_id: 'someone-else', fence: '1', result: 1 }))),
  sequence_conflict: ({ data }) => claimed(data, 'seq', (id, fence) => data.request(`/_fencegate/jobs/${id}/append`, json({ worker_id: 'w', fence, seq: 5, chunk: 'x' }))),
  lease_expired: ({ data }) => data.request('/render/1', { method: 'POST', body: '{}', headers: { 'x-execution-fence': '1', 'x-job-id': '424242' } }),
  invalid_query: ({ admin }) => admin.request('/audit?limit=0'),
  entity_frozen: ({ data }) => data.request('/payments/frozen/capture', fenced('1')),
  entity_busy: async ({ data, db }) => {
    await data.request('/serial/1', fenced('1'))
    // Another gateway holds the entity's delivery slot.
    await db.sql`UPDATE fg_fences SET inflight_token = 'elsewhere', inflight_until = now() + interval '1 hour' WHERE entity = 'se:1'`
    return data.request('/serial/1', fenced('1'))
  },
  invalid_rule: ({ admin }) => admin.request('/rules/bad', { method: 'PUT', body: '{' }),
  rules_version_conflict: ({ admin }) => admin.request('/rules/capture', { method: 'DELETE', headers: { 'if-match': '"999"' } }),
  not_found: ({ admin }) => admin.request('/entities/never-seen'),
  // Without auth, web pages are kept out (test/browser-guard.test.ts replays the attacks on a served gateway).
  host_not_allowed: ({ guarded }) => guarded.request('/payments/1/capture', { ...fenced('1'), headers: { 'x-execution-fence': '1', host: 'rebind.attacker.example:8080' } }),
  cross_site_request: ({ guarded }) => guarded.request('/payments/1/capture', { ...fenced('1'), headers: { 'x-execution-fence': '1', host: '127.0.0.1:8080', origin: 'https://attacker.example' } }),
  unsupported_media_type: ({ guardedAdmin }) => guardedAdmin.request('/entities/invoice%3A7/bump', { method: 'POST', body: '{"to":"9"}', headers: { host: '127.0.0.1:8081', 'content-type': 'text/plain' } }),
  internal_error: ({ faultyData }) => faultyData.request('/payments/1/capture', fenced('1')),
}

const I = 'invalid_request_error', K = 'idempotency_error', A = 'api_error'
/** The `error.type` each code is answered with (docs/http-contract.md states the same table). */
const envelopeTypes: Record<ProblemCode, ClientErrorType> = {
  no_route: I, invalid_request: I, unauthenticated: I, tenant_missing: I, tenant_mismatch: I, insufficient_scope: I, worker_mismatch: I,
  invalid_fence: I, fence_required: I, entity_unresolved: I, stale_fence: I, body_too_large: I,
  invalid_idempotency_key: I, idempotency_key_required: I, request_in_progress: K, idempotency_key_reused: K,
  response_not_replayable: K, outcome_unknown: A, key_not_releasable: K, upstream_unreachable: A, upstream_timeout: A, upstream_tls_failed: A,
  store_unavailable: A, store_not_replicated: A, store_identity_changed: A, store_lost_commits: A, unknown_job_type: I, job_not_found: I, job_finished: I, job_not_running: I, job_not_retryable: I, too_many_waiting_claims: I, lease_lost: I, not_owner: I,
  sequence_conflict: I, lease_expired: I, invalid_query: I, entity_frozen: I, entity_busy: I, invalid_rule: I,
  rules_version_conflict: I, not_found: I, host_not_allowed: I, cross_site_request: I, unsupported_media_type: I, unreadable_body: I, internal_error: A,
}

/** Refusals a retry can help with: they carry Retry-After and the route's hint says true; all others carry neither. */
const transient = new Set<ProblemCode>(['request_in_progress', 'store_unavailable', 'store_not_replicated', 'entity_busy', 'upstream_unreachable', 'too_many_waiting_claims'])
/** Codes answered on a matched route, so they carry the route's `retry_hint_header` (job and admin APIs have none). */
const onRoute = new Set<ProblemCode>(['unauthenticated', 'tenant_missing', 'tenant_mismatch', 'insufficient_scope', 'invalid_fence', 'fence_required',
  'entity_unresolved', 'stale_fence', 'body_too_large', 'invalid_idempotency_key', 'idempotency_key_required', 'request_in_progress',
  'idempotency_key_reused', 'response_not_replayable', 'outcome_unknown', 'upstream_unreachable', 'upstream_timeout', 'upstream_tls_failed', 'store_unavailable',
  'store_not_replicated', 'store_identity_changed', 'store_lost_commits', 'lease_expired', 'entity_frozen', 'entity_busy', 'internal_error', 'unreadable_body'])
const hint = 'Stripe-Should-Retry'

/** A Hono app whose `request` sends `Accept: accept` (when given), to see the answer's media type follow it. */
function accepting<T extends { request: (input: string, init?: RequestInit) => Response | Promise<Response> }>(app: T, accept: string | undefined): T {
  if (accept === undefined) return app
  const wrapped = Object.create(app) as T
  wrapped.request = (input: string, init: RequestInit = {}) => {
    const headers = new Headers(init.headers)
    headers.set('accept', accept)
    return app.request(input, { ...init, headers })
  }
  return wrapped
}

/**
 * The members each envelope adds, as each SDK reads them (src/http/envelopes.ts states where):
 * written out here from the SDKs' sources rather than computed by the code under test.
 */
function expectedEnvelope(envelope: ErrorEnvelope, code: ProblemCode, body: { detail: string; request_id: string; status: number }): Record<string, unknown> {
  const { status, detail } = body
  const server = status >= 500
  const auth = status === 401 || status === 403
  switch (envelope) {
    case 'stripe': return { error: { type: envelopeTypes[code], code, message: detail, request_id: body.request_id } }
    case 'square': return { errors: [{ category: server ? 'API_ERROR' : auth ? 'AUTHENTICATION_ERROR' : 'INVALID_REQUEST_ERROR', code: code.toUpperCase(), detail }] }
    case 'adyen': return { errorCode: code, message: detail, errorType: server ? 'internal' : auth ? 'security' : 'validation' }
    case 'resend': return { name: code, message: detail, statusCode: status }
  }
}
const envelopeKeys = ['error', 'errors', 'errorCode', 'errorType', 'message', 'name', 'statusCode']

/** Every envelope once, and both media types: `set` false leaves the routes on the default. */
const renderings: { envelope: ErrorEnvelope; accept: string | undefined; set: boolean }[] = [
  { envelope: 'stripe', accept: undefined, set: false },
  { envelope: 'stripe', accept: 'application/json', set: true },
  { envelope: 'square', accept: 'application/json', set: true },
  { envelope: 'adyen', accept: undefined, set: true },
  // What axios-based SDKs send: application/json named, problem+json only through the wildcard.
  { envelope: 'resend', accept: 'application/json, text/plain, */*', set: true },
]

describe.each(renderings)('every problem code, envelope $envelope, Accept $accept', ({ envelope, accept, set }) => {
  let t: TestDb
  let broken: TestDb
  let upstream: TestUpstream
  let untrusted: TestUpstream
  let pki: TestPki
  let apps: Apps
  let registry: RuleRegistry
  const undici = createUndiciForward()
  const onRouteOf = (r: Record<string, unknown>) => ({ ...r, retry_hint_header: hint, ...(set ? { error_envelope: envelope } : {}) })

  beforeAll(async () => {
    const [pglite] = backends()
    t = await pglite!.open()
    broken = await pglite!.open()
    await broken.breakStore()
    upstream = await startUpstream((req, res) => {
      if (req.path.startsWith('/slow')) return
      if (req.path.startsWith('/tiny')) return void res.end('more than one byte')
      res.end('ok')
    })
    pki = makeTestPki()
    untrusted = await startUpstream(undefined, { tls: { cert: pki.read(pki.server.certFile), key: pki.read(pki.server.keyFile) } })
    const config = testConfig([
      route(untrusted.url, { name: 'untrusted', path: '/untrusted/:id', entity: 'u:{params.id}' }),
      route(upstream.url),
      route(upstream.url, { name: 'tickets', path: '/tickets', entity: 'ticket:{body.ticket}' }),
      route(`http://127.0.0.1:${await closedPort()}`, { name: 'refused', path: '/refused/:id', entity: 'r:{params.id}' }),
      route(upstream.url, { name: 'slow', path: '/slow/:id', entity: 's:{params.id}', timeout_ms: 100 }),
      route(upstream.url, { name: 'keyed', path: '/keyed/:id', entity: 'k:{params.id}', idempotency: 'required', idempotency_wait: 0 }),
      route(upstream.url, { name: 'tiny', path: '/tiny/:id', entity: 't:{params.id}', idempotency: 'required', max_stored_body: 1 }),
      route(upstream.url, { name: 'render', path: '/render/:id', fence: 'lease', entity: 'job:{header.X-Job-Id}' }),
      route(upstream.url, { name: 'slow-keyed', path: '/slow-keyed/:id', entity: 'sk:{params.id}', idempotency: 'required', timeout_ms: 100 }),
      route(upstream.url, { name: 'serial', path: '/serial/:id', entity: 'se:{params.id}', ordering: 'serialize', ordering_wait: 10 }),
    ].map(onRouteOf), {
      // No job of type idle is ever started: a claim of it waits.
      server: { max_request_body: 1024 }, job_types: [{ name: 'report', lease: '45s' }, { name: 'idle', lease: '45s' }],
      entity_rules: [{ name: 'freeze', entity_match: 'invoice:frozen', frozen: true }],
    })
    const authConfig = testConfig([
      route(upstream.url),
      route(upstream.url, { name: 'claimed', path: '/claimed/:invoice_id', claimed_tenant: 'header.X-Tenant-Id' }),
      route(upstream.url, { name: 'scoped', path: '/scoped/:invoice_id', scopes: ['payments:write'] }),
    ].map(onRouteOf), { auth: jwtAuth, job_types: [{ name: 'report', lease: '45s' }] })
    registry = await startRuleRegistry({ db: t.db, config, log: silentLogger })
    const a = <T extends Parameters<typeof accepting>[0]>(app: T) => accepting(app, accept)
    const cappedWake = createClaimWake({ listen: createJobStore(t.db).listenForWork, maxWaitingPerTenant: 1, fallbackMs: 10 * 60_000 })
    apps = {
      capped: { app: a(createApp({ config, store: t.store, forward: undici.forward, jobs: createJobStore(t.db), claimWake: cappedWake })), wake: cappedWake },
      guarded: a(createApp({ config, store: t.store, forward: undici.forward, browserGuard: browserGuard('127.0.0.1') })),
      guardedAdmin: a(createAdminApp({ store: t.store, browserGuard: browserGuard('127.0.0.1') })),
      refusing: (code) => a(createApp({ config, store: createStore(t.db, { durability: { ...localDurability, admit: () => { throw new DurabilityRefusal(code, `refused: ${code}`) } } }), forward: undici.forward })),
      db: t.db,
      store: t.store,
      authData: a(createApp({ config: authConfig, store: t.store, forward: undici.forward, authenticate: await hmacAuthenticator(), jobs: createJobStore(t.db) })),
      data: a(createApp({ config, store: t.store, forward: undici.forward, jobs: createJobStore(t.db) })),
      admin: a(createAdminApp({ store: t.store, rules: { registry, db: t.db }, db: t.db })),
      brokenData: a(createApp({ config, store: broken.store, forward: undici.forward })),
      // A Forward with a bug of its own: the client must get a bare internal_error.
      faultyData: a(createApp({ config, store: t.store, forward: async () => { throw new TypeError('secret internal detail') } })),
    }
  })
  afterAll(async () => {
    await apps?.capped.wake.close()
    await registry?.close()
    await undici.close()
    await upstream?.close()
    await untrusted?.close()
    pki?.remove()
    await t?.close()
  })

  it('has a trigger for every code in the catalog', () => {
    expect(Object.keys(triggers).sort()).toEqual(Object.keys(problemCatalog).sort())
  })

  it.each(Object.keys(problemCatalog) as ProblemCode[])('%s is answered as problem+json with its status', async (code) => {
    const res = await triggers[code](apps)
    const body = await res.json()
    expect(res.status).toBe(problemCatalog[code].status)
    expect(res.headers.get('content-type')).toBe(accept === undefined ? 'application/problem+json' : 'application/json')
    expect(body).toMatchObject({ type: `urn:fencegate:problem:${code}`, code, status: problemCatalog[code].status, title: problemCatalog[code].title })
    expect(typeof body.detail).toBe('string')
    expect(body.request_id).toMatch(/.+/)
    expect(res.headers.get('x-request-id')).toBe(body.request_id)
    expect(JSON.stringify(body)).not.toContain('secret internal detail')
    // The envelope SDKs raise from, the route's on every refusal of a route (Stripe's elsewhere), and no other's members.
    const expected = expectedEnvelope(onRoute.has(code) ? envelope : 'stripe', code, body)
    expect(Object.fromEntries(envelopeKeys.filter((k) => k in body).map((k) => [k, body[k]]))).toEqual(expected)
    // Retry guidance: Retry-After exactly on transient refusals, and the route's hint agrees with it.
    expect(res.headers.has('retry-after'), 'Retry-After').toBe(transient.has(code))
    if (transient.has(code)) expect(Number(res.headers.get('retry-after'))).toBeGreaterThanOrEqual(1)
    expect(res.headers.get(hint), hint).toBe(onRoute.has(code) ? String(transient.has(code)) : null)
  })

  it('never turns a client mistake into a 5xx', () => {
    const clientCodes = ['unauthenticated', 'tenant_missing', 'tenant_mismatch', 'insufficient_scope', 'worker_mismatch', 'no_route', 'invalid_request', 'invalid_fence', 'fence_required', 'entity_unresolved', 'stale_fence', 'body_too_large', 'invalid_query', 'not_found', 'invalid_idempotency_key', 'idempotency_key_required', 'request_in_progress', 'idempotency_key_reused', 'response_not_replayable', 'key_not_releasable', 'unknown_job_type', 'job_not_found', 'job_finished', 'job_not_running', 'job_not_retryable', 'too_many_waiting_claims', 'lease_lost', 'not_owner', 'sequence_conflict', 'lease_expired', 'entity_frozen', 'entity_busy', 'invalid_rule', 'rules_version_conflict', 'host_not_allowed', 'cross_site_request', 'unsupported_media_type', 'unreadable_body'] as const
    for (const code of clientCodes) expect(problemCatalog[code].status).toBeLessThan(500)
  })

  it('renders unknown errors without their message', async () => {
    const res = problemResponse(new Error('password=hunter2'), 'rid')
    expect(await res.text()).not.toContain('hunter2')
    expect(res.status).toBe(500)
    expect(new FencegateError('stale_fence').detail).toBe(problemCatalog.stale_fence.title)
  })
})

describe('the media type of a problem', () => {
  it.each([
    [null, 'application/problem+json'],
    ['*/*', 'application/problem+json'],
    ['application/*', 'application/problem+json'],
    ['application/json', 'application/json'],
    ['Application/JSON; charset=utf-8', 'application/json'],
    ['application/json, text/plain, */*', 'application/json'],
    ['application/problem+json', 'application/problem+json'],
    ['application/json, application/problem+json', 'application/problem+json'],
    ['application/json;q=0.5, application/problem+json;q=0.4', 'application/json'],
    ['application/json;q=0.4, application/problem+json;q=0.5', 'application/problem+json'],
    ['application/json;q=0', 'application/problem+json'],
    ['application/json;q=abc', 'application/problem+json'],
  ] as const)('Accept %s gets %s', (accept, type) => {
    expect(problemMediaType(accept)).toBe(type)
  })
})
