import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { auditQuerySchema, createAdminApp, tenantQuerySchema } from '../src/admin/app.js'
import { silentLogger } from '../src/observe/log.js'
import { noMetrics } from '../src/observe/metrics.js'
import { startRuleRegistry } from '../src/rules/registry.js'
import {
  adminOpenApi, auditPageSchema, auditSummaryResultSchema, entityKeysSchema, fenceHistoryPageSchema, jobDetailSchema, jobListSchema, bumpRequestSchema, bumpResultSchema, entityStateSchema, healthSchema, keyReleasedSchema, keyStateSchema, problemSchema,
} from '../src/admin/openapi.js'
import { problemCatalog } from '../src/http/problems.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { hmacAuthenticator, token } from './helpers/tokens.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

type Operation = { parameters?: { name: string; in: string; schema: { pattern?: string } }[] }
const doc = adminOpenApi()
const paths = doc.paths as unknown as Record<string, Record<string, Operation>>

describe('the admin OpenAPI document stays in sync with the code', () => {
  let t: TestDb
  beforeAll(async () => {
    t = await backends()[0]!.open()
  })
  afterAll(async () => {
    await t.close()
  })

  it('describes every route the admin app registers, and nothing it does not', async () => {
    const exposition = { contentType: 'text/plain', render: async () => '' }
    const registry = await startRuleRegistry({ db: t.db, config: testConfig([route('http://127.0.0.1:9')]), log: silentLogger })
    const readiness = { draining: () => false, migrationsAtHead: async () => true, rulesLoaded: () => true, durability: () => ({ level: 'local' as const }) }
    const app = createAdminApp({ store: t.store, metrics: noMetrics, exposition, rules: { registry, db: t.db }, db: t.db, readiness })
    await registry.close()
    // The console's static files under /ui/ are a page, not API (docs/audit.md).
    const registered = new Set(app.routes.filter((r) => r.method !== 'ALL' && !r.path.startsWith('/ui')).map((r) => `${r.method.toLowerCase()} ${r.path.replace(/:([A-Za-z_]+)/g, '{$1}')}`))
    const documented = new Set(Object.entries(paths).flatMap(([path, ops]) => Object.keys(ops).map((method) => `${method} ${path}`)))
    expect([...documented].sort()).toEqual([...registered].sort())
  })

  it('lists every problem code of the catalog, with its status, in the error schema', () => {
    const problem = doc.components.schemas.Problem as { properties: { code: { enum: string[] } } }
    expect(problem.properties.code.enum).toEqual(Object.keys(problemCatalog))
    expect(doc['x-problem-codes']).toEqual(Object.fromEntries(Object.entries(problemCatalog).map(([c, p]) => [c, { status: p.status, title: p.title }])))
  })

  it('takes the query parameters and their patterns from the schemas the endpoints validate with', () => {
    const audit = paths['/audit']!.get!.parameters!
    expect(audit.map((p) => p.name)).toEqual(Object.keys(auditQuerySchema.shape))
    expect(audit.every((p) => p.in === 'query')).toBe(true)
    const limit = new RegExp(audit.find((p) => p.name === 'limit')!.schema.pattern!)
    expect(['1', '1000'].every((v) => limit.test(v)) && !limit.test('x')).toBe(true)
    for (const path of ['/entities/{entity}', '/idempotency/{key}', '/jobs/{id}']) {
      const query = Object.values(paths[path]!).flatMap((op) => op.parameters!.filter((p) => p.in === 'query').map((p) => p.name))
      expect(new Set(query)).toEqual(new Set(Object.keys(tenantQuerySchema.shape)))
    }
  })

  it('is served as GET /openapi.json, to any valid token under auth', async () => {
    const admin = createAdminApp({ store: t.store, authenticate: await hmacAuthenticator() })
    expect((await admin.request('/openapi.json')).status).toBe(401)
    const res = await admin.request('/openapi.json', { headers: { authorization: `Bearer ${await token({ scope: 'fencegate:audit' })}` } })
    expect(res.status).toBe(200)
    expect(await res.json()).toEqual(JSON.parse(JSON.stringify(doc)))
  })
})

describe.each(backends())('real admin answers match the documented schemas on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway
  beforeAll(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    gw = await startTestGateway({ config: testConfig([route(upstream.url, { idempotency: 'optional' })]), store: t.store, db: t.db })
  })
  afterAll(async () => {
    await gw.close()
    await upstream.close()
    await t.close()
  })

  const get = async (path: string, method = 'GET', body?: unknown) => {
    const res = await fetch(`${gw.adminUrl}${path}`, { method, ...(body === undefined ? {} : { body: JSON.stringify(body) }) })
    return { status: res.status, type: res.headers.get('content-type'), json: await res.json() }
  }

  it('health, audit, entities, bumps, idempotency records, releases and problems', async () => {
    expect((await post(`${gw.url}/payments/1/capture`, '5', { headers: { 'idempotency-key': 'doc-1' } })).status).toBe(200)
    expect((await post(`${gw.url}/payments/1/capture`, '4')).status).toBe(409)
    expect((await post(`${gw.url}/payments/1/capture`, '6', { headers: { 'idempotency-key': 'doc-2' } })).status).toBe(200)
    await t.db.sql`UPDATE fg_idempotency SET state = 'outcome_unknown', locked_until = NULL WHERE key = 'doc-2'`

    healthSchema.parse((await get('/health')).json)
    const page = auditPageSchema.parse((await get('/audit?limit=1')).json)
    expect(page.items).toHaveLength(1)
    entityStateSchema.parse((await get('/entities/invoice:1')).json)
    keyStateSchema.parse((await get('/idempotency/doc-1')).json)
    keyReleasedSchema.parse((await get('/idempotency/doc-2', 'DELETE')).json)
    const bump = bumpRequestSchema.parse({ min_fence: '43' })
    expect(bumpResultSchema.parse((await get('/entities/invoice:1/bump', 'POST', bump)).json)).toMatchObject({ previous_fence: '6', highest_fence: '43', raised: true })
    expect(bumpResultSchema.parse((await get('/entities/invoice:2/bump', 'POST', { min_fence: 7 })).json).previous_fence).toBeNull()
    expect(fenceHistoryPageSchema.parse((await get('/entities/invoice:1/history')).json).items).toHaveLength(3)
    expect(entityKeysSchema.parse((await get('/entities/invoice:1/keys')).json).items).toHaveLength(1)
    expect(auditSummaryResultSchema.parse((await get('/audit/summary')).json).buckets.length).toBeGreaterThan(0)
    const [job] = await t.db.sql<{ id: string }>`INSERT INTO fg_jobs (tenant, type, key, state) VALUES ('default', 'doc', 'k', 'queued') RETURNING id::text AS id`
    expect(jobListSchema.parse((await get('/jobs')).json).items).toHaveLength(1)
    expect(jobDetailSchema.parse((await get(`/jobs/${job!.id}`)).json)).toMatchObject({ job_id: job!.id, state: 'queued', remaining_lease_ms: null })
    for (const path of ['/audit?limit=0', '/audit?foo=1', '/entities/nope', '/entities/x?tenant=a&tenant=b', '/nowhere']) {
      const problem = await get(path)
      expect(problem.type, path).toBe('application/problem+json')
      problemSchema.parse(problem.json)
    }
  })
})
