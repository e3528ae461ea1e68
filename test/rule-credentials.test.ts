import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import type { Config } from '../src/config/schema.js'
import { silentLogger } from '../src/observe/log.js'
import { startRuleRegistry, type RuleRegistry } from '../src/rules/registry.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { hmacAuthenticator, jwtAuth, token } from './helpers/tokens.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * The file's credentials stay the file's (docs/security.md, "Credentials toward the upstream").
 * Before: `forward_authorization` was a rule like any other, so a tenant-A `fencegate:admin`
 * token pointed a route at its own listener with it and collected tenant B's bearer tokens;
 * and a rule that kept a route on the file's origin but changed its method or path carried
 * the file's `upstream_headers` (and client certificate) there.
 */
describe.each(backends())('the file\'s credentials under rule changes ($name)', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let foreign: TestUpstream
  let registry: RuleRegistry
  let gw: TestGateway
  let config: Config

  beforeEach(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    foreign = await startUpstream()
    config = testConfig([
      route(upstream.url, { upstream_headers: { 'x-api-key': 'file-only-secret' } }),
      route(upstream.url, { name: 'pass', path: '/pass/:invoice_id', forward_authorization: true }),
    ], { auth: jwtAuth })
    registry = await startRuleRegistry({ db: t.db, config, log: silentLogger })
    gw = await startTestGateway({ config, store: t.store, authenticate: await hmacAuthenticator(), rules: { registry, db: t.db } })
  })
  afterEach(async () => {
    await gw.close()
    await registry.close()
    await Promise.all([upstream.close(), foreign.close()])
    await t.close()
  })

  const adminA = async () => ({ 'content-type': 'application/json', authorization: `Bearer ${await token({ tenant_id: 'tenant-a', sub: 'ops-a', scope: 'fencegate:admin' })}` })
  const putRule = async (name: string, rule: Record<string, unknown>) => {
    const res = await fetch(`${gw.adminUrl}/rules/${name}`, { method: 'PUT', headers: await adminA(), body: JSON.stringify(rule) })
    return { status: res.status, json: await res.json() as { code?: string; problems?: string[] } }
  }
  const tenantB = async () => ({ authorization: `Bearer ${await token({ tenant_id: 'tenant-b', sub: 'worker-b' })}` })
  const last = (u: TestUpstream) => u.received.at(-1)!

  it('refuses a rules API call that sets forward_authorization, on a new route or the file\'s: no token of tenant B reaches the listener', async () => {
    for (const [name, rule] of [
      ['collector', route(foreign.url, { name: 'collector', path: '/collect/:invoice_id', forward_authorization: true })],
      ['pass', route(foreign.url, { name: 'pass', path: '/pass/:invoice_id', forward_authorization: true })],
      ['pass', route(upstream.url, { name: 'pass', path: '/pass/:invoice_id', forward_authorization: false })],
    ] as const) {
      const res = await putRule(name, rule)
      expect([res.status, res.json.code]).toEqual([422, 'invalid_rule'])
      expect(res.json.problems!.join('\n')).toContain('forward_authorization')
    }
    const headers = await tenantB()
    expect((await post(`${gw.url}/collect/1`, '1', { headers })).status).toBe(404)
    // The file's route still passes the caller's token, to the file's upstream only.
    expect((await post(`${gw.url}/pass/1`, '1', { headers })).status).toBe(200)
    expect(last(upstream).headers.authorization).toBe(headers.authorization)
    expect(foreign.received).toHaveLength(0)
  })

  it('a rule that moves a forward_authorization route to another origin, path or method passes no caller token', async () => {
    const headers = await tenantB()
    expect((await putRule('pass', route(foreign.url, { name: 'pass', path: '/pass/:invoice_id' }))).status).toBe(200)
    expect((await post(`${gw.url}/pass/1`, '1', { headers })).status).toBe(200)
    expect(last(foreign).headers.authorization).toBeUndefined()
    expect((await putRule('pass', route(upstream.url, { name: 'pass', path: '/elsewhere/:invoice_id' }))).status).toBe(200)
    expect((await post(`${gw.url}/elsewhere/1`, '2', { headers })).status).toBe(200)
    expect(last(upstream)).toMatchObject({ path: '/elsewhere/1' })
    expect(last(upstream).headers.authorization).toBeUndefined()
    expect((await putRule('pass', route(upstream.url, { name: 'pass', method: 'PUT', path: '/pass/:invoice_id' }))).status).toBe(200)
    const put = await fetch(`${gw.url}/pass/1`, { method: 'PUT', headers: { ...headers, 'content-type': 'application/json', 'x-execution-fence': '3' }, body: '{}' })
    expect(put.status).toBe(200)
    expect(last(upstream)).toMatchObject({ method: 'PUT' })
    expect(last(upstream).headers.authorization).toBeUndefined()
    // Back as the file has it: the file's setting applies again.
    expect((await putRule('pass', route(upstream.url, { name: 'pass', path: '/pass/:invoice_id' }))).status).toBe(200)
    expect((await post(`${gw.url}/pass/1`, '4', { headers })).status).toBe(200)
    expect(last(upstream).headers.authorization).toBe(headers.authorization)
  })

  it('a rule that moves a route to another method or path of the file\'s origin carries none of the file\'s upstream_headers; a narrower path keeps them', async () => {
    const headers = await tenantB()
    const cases: [rule: Record<string, unknown>, method: string, path: string, credential: string | undefined][] = [
      [route(upstream.url, { path: '/admin/:invoice_id/capture' }), 'POST', '/admin/1/capture', undefined],
      [route(`${upstream.url}/internal`, {}), 'POST', '/payments/1/capture', undefined],
      [route(upstream.url, { method: 'DELETE' }), 'DELETE', '/payments/1/capture', undefined],
      [route(upstream.url, { path: '/payments/:invoice_id/capture/partial' }), 'POST', '/payments/1/capture/partial', 'file-only-secret'],
      [route(upstream.url, { path: '/payments/:other/capture', entity: 'invoice:{params.other}' }), 'POST', '/payments/1/capture', 'file-only-secret'],
    ]
    for (const [i, [rule, method, path, credential]] of cases.entries()) {
      expect((await putRule('capture', rule)).status).toBe(200)
      const res = await fetch(`${gw.url}${path}`, { method, headers: { ...headers, 'content-type': 'application/json', 'x-execution-fence': String(i + 1) }, body: '{}' })
      expect(res.status, path).toBe(200)
      expect(last(upstream).headers['x-api-key'], `${method} ${path}`).toBe(credential)
    }
  })

  it('a stored version that says forward_authorization: true (seeded before, or written into the table) passes no token', async () => {
    const rule = { ...route(foreign.url, { name: 'collector', path: '/collect/:invoice_id' }), forward_authorization: true }
    await t.db.sql`
      INSERT INTO fg_rule_versions (version, name, kind, rule, changed_by, source)
      SELECT max(version) + 1, 'collector', 'route', ${JSON.stringify(rule)}::text::jsonb, 'ops-a', 'api' FROM fg_rule_versions`
    await registry.refresh()
    const headers = await tenantB()
    expect((await post(`${gw.url}/collect/1`, '1', { headers })).status).toBe(200)
    expect(foreign.received).toHaveLength(1)
    expect(last(foreign).headers.authorization).toBeUndefined()
  })
})
