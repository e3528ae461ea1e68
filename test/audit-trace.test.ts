import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createJobStore } from '../src/leases/store.js'
import { migrate } from '../src/store/migrate.js'
import { loadMigrations } from '../src/store/migrations-fs.js'
import { silentLogger } from '../src/observe/log.js'
import { startTracing, type NodeTracing } from '../src/runtime/node/tracing.js'
import { tracingSettings } from '../src/runtime/node/tracing-env.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { spanKind, startCollector, type Collector, type ReceivedSpan } from './helpers/otlp.js'
import { hmacAuthenticator, jwtAuth, token } from './helpers/tokens.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

// Issue 31: every audit row names the trace of the request that caused it, and /audit finds a
// trace's rows. Two gateways on one store: one traced (spans to a real OTLP receiver), one not.
describe.each(backends())('audit rows name their trace on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let collector: Collector
  let traced: NodeTracing
  let gw: TestGateway
  let plain: TestGateway

  beforeAll(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    collector = await startCollector()
    traced = startTracing(tracingSettings({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: collector.url })!, silentLogger)
    const config = testConfig([
      route(upstream.url, { idempotency: 'optional' }),
      route(upstream.url, { name: 'render', path: '/reports/:id', fence: 'lease', entity: 'job:{header.X-Job-Id}' }),
    ], { auth: jwtAuth, job_types: [{ name: 'report', lease: '45s' }] })
    const common = { config, store: t.store, authenticate: await hmacAuthenticator(), jobs: createJobStore(t.db), db: t.db }
    gw = await startTestGateway({ ...common, tracing: traced.tracing, storeSystem: backend.name === 'postgres' ? 'postgresql' : 'pglite' })
    plain = await startTestGateway({ ...common, jobs: createJobStore(t.db) })
  })
  afterAll(async () => {
    await gw.close()
    await plain.close()
    await traced.shutdown()
    await collector.close()
    await upstream.close()
    await t.close()
  })

  const as = async (claims: Record<string, unknown>) => ({ authorization: `Bearer ${await token(claims)}` })
  const operator = { sub: 'operator-alice', scope: 'fencegate:admin' }
  const capture = async (at: TestGateway, invoice: number, fence?: string, headers: Record<string, string> = {}, body?: string) =>
    post(`${at.url}/payments/${invoice}/capture`, fence, { headers: { ...(await as({ sub: 'worker-a' })), ...headers }, ...(body ? { body } : {}) })
  const admin = async (at: TestGateway, path: string, method = 'GET', body?: unknown) => {
    const res = await fetch(`${at.adminUrl}${path}`, {
      method, headers: { ...(await as(operator)), 'content-type': 'application/json' }, ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    })
    return { status: res.status, json: await res.json() as any }
  }
  const jobs = async (path: string, claims: Record<string, unknown>, body: unknown) => {
    const res = await fetch(`${gw.url}/_fencegate/jobs${path}`, { method: 'POST', headers: { ...(await as(claims)), 'content-type': 'application/json' }, body: JSON.stringify(body) })
    return { status: res.status, json: await res.json() as any }
  }
  /** The exported SERVER spans, once every span ended so far has reached the receiver. */
  const servers = async (): Promise<ReceivedSpan[]> => {
    await traced.flush()
    return collector.spans.filter((s) => s.kind === spanKind.server)
  }
  /** The trace of the data-plane command that answered with this request id. */
  const traceOfRequest = async (requestId: string) => (await servers()).find((s) => s.attributes['fencegate.request_id'] === requestId)!.traceId
  const rowsOf = async (filter: string) => (await admin(plain, `/audit?tenant=acme&${filter}`)).json.items as any[]

  it('a stale command\'s row names its SERVER span\'s trace, and ?trace_id= returns exactly that row; an untraced one names none', async () => {
    expect((await capture(gw, 42, '7')).status).toBe(200)
    const stale = await capture(gw, 42, '6')
    expect(stale.json.code).toBe('stale_fence')
    const untraced = await capture(plain, 42, '5')
    expect(untraced.json.code).toBe('stale_fence')
    const span = (await servers()).find((s) => s.attributes['fencegate.decision'] === 'stale_fence')!
    expect(span.attributes['fencegate.request_id']).toBe(stale.headers.get('x-request-id'))
    const page = await admin(plain, `/audit?trace_id=${span.traceId}`)
    expect(page.status).toBe(200)
    expect(page.json.items.map((i: any) => [i.code, i.presented_fence, i.request_id, i.trace_id, i.trace_from_caller])).toEqual([
      ['stale_fence', '6', stale.headers.get('x-request-id'), span.traceId, false],
    ])
    const row = (await rowsOf('entity=invoice:42&code=stale_fence')).find((i) => i.request_id === untraced.headers.get('x-request-id'))
    expect(row).toMatchObject({ presented_fence: '5', trace_id: null, trace_from_caller: null })
    // The summary and the export filter by it too.
    const summary = await admin(plain, `/audit/summary?trace_id=${span.traceId}`)
    expect(summary.json.buckets.map((b: any) => [b.code, b.count])).toEqual([['stale_fence', 1]])
    const csv = await (await fetch(`${plain.adminUrl}/audit?format=csv&trace_id=${span.traceId}`, { headers: await as(operator) })).text()
    const [head, line, end] = csv.split('\r\n')
    expect(head!.split(',').slice(-2)).toEqual(['trace_id', 'trace_from_caller'])
    expect(line!.split(',').slice(-2)).toEqual([span.traceId, 'false'])
    expect(end).toBe('')
  })

  it('a command whose trace is not sampled still names it: the caller\'s, as its log lines and the upstream have it', async () => {
    const callerTrace = '0af7651916cd43dd8448eb211c80319c'
    const stale = await capture(gw, 42, '4', { traceparent: `00-${callerTrace}-b7ad6b7169203331-00` })
    expect(stale.json.code).toBe('stale_fence')
    expect((await servers()).some((s) => s.traceId === callerTrace)).toBe(false)
    expect((await admin(plain, `/audit?trace_id=${callerTrace}`)).json.items.map((i: any) => [i.request_id, i.trace_from_caller])).toEqual([[stale.headers.get('x-request-id'), true]])
  })

  // The security review: a caller's traceparent chose the trace id its rows name, unmarked, so a
  // caller could file its refusals under any trace (another request's included) and an operator
  // following ?trace_id= could not tell. Marked in the row, the CSV export and the CLI's table.
  it('marks a trace id the caller chose, sampled or not, and only that one', async () => {
    const chosen = 'c0ffee00c0ffee00c0ffee00c0ffee00'
    const sampled = await capture(gw, 42, '2', { traceparent: `00-${chosen}-b7ad6b7169203331-01` })
    expect(sampled.json.code).toBe('stale_fence')
    // An invalid traceparent (all-zero trace id) is not continued: the gateway starts its own trace.
    const invalid = await capture(gw, 42, '1', { traceparent: `00-${'0'.repeat(32)}-b7ad6b7169203331-01` })
    expect(invalid.json.code).toBe('stale_fence')
    const rows = await rowsOf('entity=invoice:42&code=stale_fence')
    const of = (r: { headers: Headers }) => rows.find((i) => i.request_id === r.headers.get('x-request-id'))
    expect([of(sampled).trace_id, of(sampled).trace_from_caller]).toEqual([chosen, true])
    expect(of(invalid).trace_id).toMatch(/^[0-9a-f]{32}$/)
    expect(of(invalid).trace_id).not.toBe('0'.repeat(32))
    expect(of(invalid).trace_from_caller).toBe(false)
    const csv = await (await fetch(`${plain.adminUrl}/audit?format=csv&trace_id=${chosen}`, { headers: await as(operator) })).text()
    expect(csv.split('\r\n')[1]!.split(',').slice(-2)).toEqual([chosen, 'true'])
  })

  it('every way a command is refused names its trace: before the fence, a stale fence with a key, a reused key, a lease that is not live', async () => {
    const refusals = [
      await capture(gw, 50),
      await capture(gw, 42, '3', { 'idempotency-key': 'k-stale' }),
      await capture(gw, 51, '1', { 'idempotency-key': 'k-reused' }, '{"a":1}'),
      await capture(gw, 51, '1', { 'idempotency-key': 'k-reused' }, '{"a":2}'),
      await post(`${gw.url}/reports/1`, '9', { headers: { ...(await as({ sub: 'worker-a' })), 'x-job-id': '12345' } }),
    ].filter((r) => r.status !== 200)
    expect(refusals.map((r) => r.json.code)).toEqual(['fence_required', 'stale_fence', 'idempotency_key_reused', 'lease_expired'])
    for (const r of refusals) {
      const requestId = r.headers.get('x-request-id')!
      const traceId = await traceOfRequest(requestId)
      expect((await admin(plain, `/audit?trace_id=${traceId}`)).json.items.map((i: any) => [i.code, i.request_id])).toEqual([[r.json.code, requestId]])
    }
  })

  it('the job API\'s rows name the call\'s trace: a refused scope, and a completion by a holder that lost the job', async () => {
    const worker = { sub: 'worker-j', scope: 'jobs:start jobs:work' }
    const started = await jobs('', worker, { type: 'report', key: 'trace-1' })
    const held = (await jobs('/claim', worker, { worker_id: 'worker-j' })).json as { job_id: string; fence: string }
    expect(held.job_id).toBe(started.json.job_id)
    expect((await jobs(`/${held.job_id}/heartbeat`, { sub: 'worker-j', scope: 'jobs:start' }, { worker_id: 'worker-j', fence: held.fence })).json.code).toBe('insufficient_scope')
    expect((await jobs(`/${held.job_id}/complete`, worker, { worker_id: 'worker-j', fence: String(BigInt(held.fence) + 1n), result: 1 })).json.code).toBe('not_owner')
    const spans = await servers()
    for (const [verb, code] of [['heartbeat', 'insufficient_scope'], ['complete', 'result_rejected']] as const) {
      const span = spans.find((s) => s.name === `POST /_fencegate/jobs/{job_id}/${verb}`)!
      expect((await admin(plain, `/audit?trace_id=${span.traceId}`)).json.items.map((i: any) => [i.code, i.entity])).toEqual([[code, `job:${held.job_id}`]])
    }
  })

  it('the admin plane\'s requests are SERVER spans by route template, and a bump\'s, a key release\'s or an operator action\'s row names its trace', async () => {
    const bump = await admin(gw, '/entities/invoice:60/bump?tenant=acme', 'POST', { min_fence: '9' })
    expect(bump.status).toBe(200)
    const worker = { sub: 'worker-k', scope: 'jobs:start' }
    const { job_id: id } = (await jobs('', worker, { type: 'report', key: 'trace-2' })).json
    expect((await admin(gw, `/jobs/${id}/cancel?tenant=acme`, 'POST')).json.state).toBe('cancelled')
    await t.db.sql`
      INSERT INTO fg_idempotency (tenant, key, fingerprint, route, state, entity, expires_at, owner_token, request_id)
      VALUES ('acme', 'k-unknown', 'f', 'capture', 'outcome_unknown', 'invoice:62', now() + interval '1 hour', 'o', 'r')`
    expect((await admin(gw, '/idempotency/k-unknown?tenant=acme', 'DELETE')).json.released).toBe(true)
    expect((await admin(gw, '/no-such-endpoint')).status).toBe(404)
    // The admin plane's spans: a data-plane one has the path as sent; an admin one its template, or none when unmatched.
    const spans = (await servers()).filter((s) => !/^\/(_fencegate|payments|reports)\//.test(String(s.attributes['url.path'] ?? '')))
    const of = (name: string) => spans.find((s) => s.name === name)!
    expect(of('POST /entities/:entity/bump').attributes).toMatchObject({
      'http.request.method': 'POST', 'url.path': '/entities/{entity}/bump', 'url.scheme': 'http', 'http.route': '/entities/:entity/bump', 'http.response.status_code': 200,
    })
    expect(of('POST /jobs/:id/cancel').attributes).toMatchObject({ 'http.route': '/jobs/:id/cancel', 'http.response.status_code': 200 })
    // No route matched: the method alone, and the refusal's code as the decision.
    expect(spans.find((s) => s.name === 'GET' && s.attributes['url.path'] === undefined)).toMatchObject({ attributes: { 'http.response.status_code': 404, 'fencegate.decision': 'not_found' } })
    const bumped = await rowsOf('entity=invoice:60&code=fence_bumped')
    expect(bumped.map((i) => i.trace_id)).toEqual([of('POST /entities/:entity/bump').traceId])
    const released = await rowsOf('entity=invoice:62&code=idempotency_key_released')
    expect(released.map((i) => i.trace_id)).toEqual([of('DELETE /idempotency/:key').traceId])
    const cancelled = await rowsOf(`entity=job:${id}&code=job_cancelled`)
    expect(cancelled.map((i) => [i.caller, i.trace_id])).toEqual([['operator-alice', of('POST /jobs/:id/cancel').traceId]])
    // Through the gateway that does not trace: no trace id.
    expect((await admin(plain, '/entities/invoice:61/bump?tenant=acme', 'POST', { min_fence: '1' })).status).toBe(200)
    expect((await rowsOf('entity=invoice:61&code=fence_bumped')).map((i) => i.trace_id)).toEqual([null])
  })

  it.each(['XYZ', 'A'.repeat(32), 'a'.repeat(31), 'a'.repeat(33), `${'a'.repeat(31)}g`])('refuses trace_id=%s with the catalogued 400 problem', async (value) => {
    for (const path of ['/audit', '/audit/summary']) {
      const r = await admin(plain, `${path}?trace_id=${value}`)
      expect([r.status, r.json.code, r.json.parameter]).toEqual([400, 'invalid_query', 'trace_id'])
    }
  })
})

describe.each(backends())('migration 0016 on $name', (backend) => {
  it('applies on a database at 0015: earlier rows name no trace, and each auditing function has one signature, which 0015\'s calls still reach', async () => {
    const t = await backend.open()
    try {
      await t.db.exec('DROP SCHEMA public CASCADE; CREATE SCHEMA public;')
      const all = loadMigrations()
      await migrate(t.db, all.filter((m) => m.id <= 15))
      const present = (fence: number, requestId: string) =>
        t.db.sql`SELECT fg_present_fence('acme', 'capture', 'invoice:1', ${fence}::bigint, 'POST', '/p', NULL, 'w', ${requestId})`
      await present(5, 'r1')
      await present(4, 'before')
      expect((await migrate(t.db, all.filter((m) => m.id <= 16))).applied.map((m) => m.id)).toEqual([16])
      const functions = await t.db.sql<{ proname: string; n: number }>`
        SELECT proname, count(*)::int AS n FROM pg_proc WHERE proname IN ('fg_present_fence', 'fg_reserve', 'fg_complete_jobs') GROUP BY proname ORDER BY proname`
      expect(functions.map((f) => [f.proname, f.n])).toEqual([['fg_complete_jobs', 1], ['fg_present_fence', 1], ['fg_reserve', 1]])
      // The argument lists 0015 took still resolve, to the one function (its new parameter has a default).
      await present(3, 'after')
      await t.db.sql`SELECT * FROM fg_reserve('acme', 'capture', 'invoice:1', 2::bigint, 'POST', '/p', NULL, 'w', 'reserve', NULL, NULL, NULL, NULL::bigint, NULL::bigint, false, NULL::bigint)`
      const traceId = '4bf92f3577b34da6a3ce929d0e0e4736'
      await t.db.sql`SELECT * FROM fg_reserve('acme', 'capture', 'invoice:1', 1::bigint, 'POST', '/p', NULL, 'w', 'traced', NULL, NULL, NULL, NULL::bigint, NULL::bigint, false, NULL::bigint, ${traceId})`
      await migrate(t.db, all)
      const rows = await t.store.listAudit({ limit: 10 })
      expect(rows.map((r) => [r.request_id, r.presented_fence, r.trace_id])).toEqual([
        ['traced', '1', traceId], ['reserve', '2', null], ['after', '3', null], ['before', '4', null],
      ])
    } finally {
      await t.close()
    }
  })

  it('0020 on a database at 0019: earlier rows unmarked, a caller: trace id split off whichever function audits, and no function body changed', async () => {
    const t = await backend.open()
    try {
      await t.db.exec('DROP SCHEMA public CASCADE; CREATE SCHEMA public;')
      const all = loadMigrations()
      await migrate(t.db, all.filter((m) => m.id <= 19))
      const traceId = '4bf92f3577b34da6a3ce929d0e0e4736'
      const present = (fence: number, requestId: string, trace: string | null) =>
        t.db.sql`SELECT fg_present_fence('acme', 'capture', 'invoice:1', ${fence}::bigint, 'POST', '/p', NULL, 'w', ${requestId}, NULL, ${trace})`
      await present(5, 'r1', null)
      await present(4, 'before', traceId)
      const bodies = () => t.db.sql<{ def: string }>`
        SELECT pg_get_functiondef(oid) AS def FROM pg_proc WHERE proname LIKE 'fg\\_%' AND proname <> 'fg_audit_trace_origin' ORDER BY oid`
      const before = await bodies()
      expect(before.length).toBeGreaterThan(3)
      expect((await migrate(t.db, all.filter((m) => m.id <= 20))).applied.map((m) => m.id)).toEqual([20])
      expect(await bodies()).toEqual(before)
      await present(3, 'caller', `caller:${traceId}`)
      await present(2, 'gateway', traceId)
      await t.db.sql`SELECT * FROM fg_reserve('acme', 'capture', 'invoice:1', 1::bigint, 'POST', '/p', NULL, 'w', 'reserve', NULL, NULL, NULL, NULL::bigint, NULL::bigint, false, NULL::bigint, ${`caller:${traceId}`})`
      const rows = await t.store.listAudit({ limit: 10 })
      expect(rows.map((r) => [r.request_id, r.trace_id, r.trace_from_caller])).toEqual([
        ['reserve', traceId, true], ['gateway', traceId, false], ['caller', traceId, true], ['before', traceId, null],
      ])
    } finally {
      await t.close()
    }
  })

  it('a trace_id filter is served by fg_audit_by_trace, also across tenants', async () => {
    const t = await backend.open()
    try {
      await t.db.sql`
        INSERT INTO fg_audit (tenant, code, method, path, request_id, trace_id)
        SELECT 't' || (n % 7), 'stale_fence', 'POST', '/p', 'r' || n, CASE WHEN n % 3 = 0 THEN NULL ELSE md5(n::text) END
        FROM generate_series(1, 3000) AS n`
      await t.db.exec('ANALYZE fg_audit')
      for (const tenant of [null, 't1']) {
        const plan = await t.db.sql<{ 'QUERY PLAN': string }>`
          EXPLAIN SELECT id FROM fg_audit WHERE (${tenant}::text IS NULL OR tenant = ${tenant}) AND trace_id = ${'c4ca4238a0b923820dcc509a6f75849b'}
          ORDER BY id DESC LIMIT 101`
        expect(plan.map((p) => p['QUERY PLAN']).join('\n')).toContain('fg_audit_by_trace')
      }
    } finally {
      await t.close()
    }
  })
})
