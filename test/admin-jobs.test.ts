import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { bearer, hmacAuthenticator, jwtAuth } from './helpers/tokens.js'

describe.each(backends())('GET /jobs on the admin plane ($name)', (backend) => {
  let t: TestDb
  let gw: TestGateway
  const admin = (path: string, claims: Record<string, unknown> = { scope: 'fencegate:admin' }) =>
    bearer(claims).then((headers) => fetch(`${gw.adminUrl}${path}`, { headers })).then(async (res) => ({ status: res.status, json: await res.json() as any }))

  beforeEach(async () => {
    t = await backend.open()
    gw = await startTestGateway({ config: testConfig([route('http://127.0.0.1:9')], { auth: jwtAuth }), store: t.store, db: t.db, authenticate: await hmacAuthenticator() })
    await t.db.sql`
      INSERT INTO fg_jobs (tenant, type, key, state, fence, attempt, owner, lease_until, started_at, payload)
      VALUES ('acme', 'export', 'e-1', 'running', 3, 2, 'worker-b', now() + interval '30 seconds', now(), '{"secret":"payload"}'),
             ('acme', 'export', 'e-2', 'queued', 0, 0, NULL, NULL, NULL, NULL),
             ('acme', 'import', 'i-1', 'succeeded', 1, 1, 'worker-a', NULL, now(), NULL),
             ('other', 'export', 'o-1', 'running', 1, 1, 'worker-z', now() + interval '30 seconds', now(), NULL)`
  })
  afterEach(async () => {
    await gw.close()
    await t.close()
  })

  it('lists the tenant\'s jobs newest first, with a running job\'s holder, fence, attempt and remaining lease', async () => {
    const { status, json } = await admin('/jobs?tenant=acme')
    expect(status).toBe(200)
    expect(json.items.map((j: any) => j.key)).toEqual(['i-1', 'e-2', 'e-1'])
    const running = json.items[2]
    expect(running).toMatchObject({ type: 'export', state: 'running', owner: 'worker-b', fence: '3', attempt: 2 })
    expect(running.remaining_lease_ms).toBeGreaterThan(0)
    expect(running.remaining_lease_ms).toBeLessThanOrEqual(30_000)
    expect(json.items[1].remaining_lease_ms).toBeNull()
    expect(running).not.toHaveProperty('payload')
    expect(json.next_cursor).toBeNull()
  })

  it('filters by state and type and pages by numeric id', async () => {
    expect((await admin('/jobs?tenant=acme&state=running')).json.items.map((j: any) => j.key)).toEqual(['e-1'])
    expect((await admin('/jobs?tenant=acme&type=export')).json.items.map((j: any) => j.key)).toEqual(['e-2', 'e-1'])
    const first = await admin('/jobs?tenant=acme&limit=2')
    expect(first.json.items).toHaveLength(2)
    const rest = await admin(`/jobs?tenant=acme&before=${first.json.next_cursor}`)
    expect(rest.json.items.map((j: any) => j.key)).toEqual(['e-1'])
    expect((await admin('/jobs?state=done')).status).toBe(400)
  })

  it('shows one job with its result and error, and only in its tenant', async () => {
    const [row] = await t.db.sql<{ id: string }>`SELECT id::text AS id FROM fg_jobs WHERE key = 'e-1'`
    expect((await admin(`/jobs/${row!.id}?tenant=acme`)).json).toMatchObject({ job_id: row!.id, owner: 'worker-b', result: null, error: null })
    expect((await admin(`/jobs/${row!.id}?tenant=other`)).status).toBe(404)
    expect((await admin('/jobs/not-a-number')).status).toBe(404)
  })

  it('needs the fencegate:admin scope', async () => {
    expect((await admin('/jobs', { scope: 'fencegate:audit', tenant_id: 'acme' })).json.code).toBe('insufficient_scope')
    expect((await admin('/entities/invoice:1/history', { scope: 'fencegate:audit', tenant_id: 'acme' })).json.code).toBe('insufficient_scope')
    const summary = await admin('/audit/summary?tenant=other', { scope: 'fencegate:audit', tenant_id: 'acme' })
    expect(summary.json.code).toBe('insufficient_scope')
    expect((await admin('/audit/summary', { scope: 'fencegate:audit', tenant_id: 'acme' })).status).toBe(200)
  })
})
