import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { createJobStore } from '../src/leases/store.js'
import { silentLogger } from '../src/observe/log.js'
import { startRuleRegistry, type RuleRegistry } from '../src/rules/registry.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { bearer, hmacAuthenticator, jwtAuth } from './helpers/tokens.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * Every endpoint that reads or writes the store, with the store gone: each answers the same
 * retryable `503 store_unavailable` (with `Retry-After`), naming no internals, never a 500.
 */
const endpoints: { plane: 'data' | 'admin'; method: string; path: string; body?: string; fence?: string }[] = [
  { plane: 'data', method: 'POST', path: '/payments/1/capture', fence: '2' },
  { plane: 'data', method: 'POST', path: '/payments/1/capture', fence: '2', body: '{"k":1}' },
  { plane: 'data', method: 'POST', path: '/_fencegate/jobs', body: '{"type":"export","key":"e-1"}' },
  { plane: 'data', method: 'POST', path: '/_fencegate/jobs/claim', body: '{"worker_id":"ops/w1"}' },
  { plane: 'data', method: 'GET', path: '/_fencegate/jobs/1' },
  { plane: 'admin', method: 'GET', path: '/audit' },
  { plane: 'admin', method: 'GET', path: '/audit?format=csv' },
  { plane: 'admin', method: 'GET', path: '/audit/summary' },
  { plane: 'admin', method: 'GET', path: '/entities/invoice:1' },
  { plane: 'admin', method: 'POST', path: '/entities/invoice:1/bump', body: '{"min_fence":"9"}' },
  { plane: 'admin', method: 'GET', path: '/entities/invoice:1/history' },
  { plane: 'admin', method: 'GET', path: '/entities/invoice:1/keys' },
  { plane: 'admin', method: 'GET', path: '/idempotency/k-1' },
  { plane: 'admin', method: 'DELETE', path: '/idempotency/k-1' },
  { plane: 'admin', method: 'GET', path: '/jobs' },
  { plane: 'admin', method: 'GET', path: '/jobs/1' },
  { plane: 'admin', method: 'GET', path: '/rules/slow/history' },
  { plane: 'admin', method: 'PUT', path: '/rules/slow', body: '{"route":"capture","fence":"off"}' },
  { plane: 'admin', method: 'DELETE', path: '/rules/slow' },
]

describe.each(backends())('with the store gone ($name)', (backend) => {
  let t: TestDb
  let gw: TestGateway
  let upstream: TestUpstream
  let registry: RuleRegistry

  beforeEach(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    const config = testConfig([route(upstream.url, { idempotency: 'optional' })], { auth: jwtAuth, job_types: [{ name: 'export', lease: '30s' }] })
    registry = await startRuleRegistry({ db: t.db, config, log: silentLogger, checkEveryMs: 3_600_000 })
    gw = await startTestGateway({ config, store: t.store, authenticate: await hmacAuthenticator(), jobs: createJobStore(t.db), rules: { registry, db: t.db }, db: t.db })
    await t.breakStore()
  })
  afterEach(async () => {
    await gw.close()
    await registry.close()
    await upstream.close()
    await t.close()
  })

  it.each(endpoints)('$method $path ($plane plane) answers a retryable 503 store_unavailable', async (e) => {
    const headers: Record<string, string> = { ...(await bearer({ scope: 'fencegate:admin fencegate:jobs', sub: 'ops' })), 'content-type': 'application/json' }
    if (e.fence) headers['x-execution-fence'] = e.fence
    if (e.body === '{"k":1}') headers['idempotency-key'] = 'k-1'
    const res = await fetch(`${e.plane === 'data' ? gw.url : gw.adminUrl}${e.path}`, { method: e.method, headers, ...(e.body ? { body: e.body } : {}) })
    const text = await res.text()
    expect([res.status, res.headers.get('retry-after'), res.headers.get('content-type')], text).toEqual([503, '1', 'application/problem+json'])
    expect(JSON.parse(text)).toMatchObject({ code: 'store_unavailable', status: 503 })
    expect(text).not.toMatch(/fencegate_t|database|relation|postgres|pglite/i)
    expect(upstream.received).toHaveLength(0)
  })

  it('GET /rules still shows the rules this gateway applies: a failed reload keeps the set in use', async () => {
    const res = await fetch(`${gw.adminUrl}/rules`, { headers: await bearer({ scope: 'fencegate:admin' }) })
    expect([res.status, res.headers.get('etag')]).toEqual([200, '"1"'])
    expect((await res.json() as { rules: { name: string }[] }).rules.map((r) => r.name)).toEqual(['capture'])
  })
})
