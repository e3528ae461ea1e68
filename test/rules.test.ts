import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import type { Config } from '../src/config/schema.js'
import { createLogger, type LogFields, type Logger } from '../src/observe/log.js'
import { StoreError } from '../src/store/db.js'
import { ruleChangedSchema, ruleDeletedSchema, ruleHistorySchema, ruleOneSchema, ruleSetSchema } from '../src/admin/openapi.js'
import { startRuleRegistry, type RuleRegistry } from '../src/rules/registry.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

/** A logger that keeps every line, to assert on events and fields. */
function memoryLog(): Logger & { lines: { event: string; fields: LogFields }[] } {
  const lines: { event: string; fields: LogFields }[] = []
  const at = (event: string, fields: LogFields = {}) => void lines.push({ event, fields })
  return { lines, debug: at, info: at, warn: at, error: at }
}

const admin = (base: string, path: string, init: { method?: string; body?: unknown; headers?: Record<string, string> } = {}) =>
  fetch(base + path, {
    method: init.method ?? 'GET',
    headers: { 'content-type': 'application/json', ...init.headers },
    ...(init.body === undefined ? {} : { body: typeof init.body === 'string' ? init.body : JSON.stringify(init.body) }),
  }).then(async (res) => ({ status: res.status, headers: res.headers, json: await res.json() as any }))

describe.each(backends())('rules at runtime ($name)', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let config: Config
  let registry: RuleRegistry
  let gw: TestGateway
  let log: ReturnType<typeof memoryLog>

  async function start(c: Config = config) {
    log = memoryLog()
    registry = await startRuleRegistry({ db: t.db, config: c, log })
    gw = await startTestGateway({ config: c, store: t.store, log, rules: { registry, db: t.db } })
  }
  async function stop() {
    await gw.close()
    await registry.close()
  }

  beforeEach(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    config = testConfig([
      route(upstream.url, { upstream_headers: { Authorization: 'Bearer file-only-secret' } }),
      route(upstream.url, { name: 'tickets', path: '/tickets/:id', entity: 'ticket:{params.id}', fence: 'optional' }),
    ])
    await start()
  })
  afterEach(async () => {
    await stop()
    await upstream.close()
    await t.close()
  })

  it('seeds the file rules as versions, without the upstream credentials', async () => {
    const res = await admin(gw.adminUrl, '/rules')
    expect(res.status).toBe(200)
    expect(res.json.version).toBe(2)
    expect(res.headers.get('etag')).toBe('"2"')
    expect(res.json.rules.map((r: { name: string }) => r.name)).toEqual(['capture', 'tickets'])
    expect(JSON.stringify(res.json)).not.toContain('file-only-secret')
    expect(JSON.stringify(res.json.rules[0])).not.toContain('upstream_headers')
    // The credentials still reach the upstream: the file applies them by route name.
    expect((await post(`${gw.url}/payments/1/capture`, '1')).status).toBe(200)
    expect(upstream.received[0]!.headers.authorization).toBe('Bearer file-only-secret')
  })

  it('a rule that points a route at another origin carries none of the file\'s upstream credentials (they leaked to any listener before)', async () => {
    const foreign = await startUpstream()
    try {
      const moved = await admin(gw.adminUrl, '/rules/capture', { method: 'PUT', body: route(foreign.url) })
      expect(moved.status).toBe(200)
      expect((await post(`${gw.url}/payments/1/capture`, '1')).status).toBe(200)
      expect(foreign.received).toHaveLength(1)
      expect(foreign.received[0]!.headers.authorization).toBeUndefined()
      expect(JSON.stringify(foreign.received[0]!.headers)).not.toContain('file-only-secret')
      // Also after a restart, when the stored rule wins over the file.
      await stop()
      await start()
      expect((await post(`${gw.url}/payments/1/capture`, '2')).status).toBe(200)
      expect(foreign.received[1]!.headers.authorization).toBeUndefined()
      // On the file's origin under another base path it is still withheld (it followed the origin alone before):
      // the upstream path is not one the file sends (test/rule-credentials.test.ts has the rest).
      expect((await admin(gw.adminUrl, '/rules/capture', { method: 'PUT', body: route(`${upstream.url}/v2`) })).status).toBe(200)
      expect((await post(`${gw.url}/payments/1/capture`, '3')).status).toBe(200)
      expect(upstream.received.at(-1)!.headers.authorization).toBeUndefined()
      // Back as the file has it, the credential is sent again.
      expect((await admin(gw.adminUrl, '/rules/capture', { method: 'PUT', body: route(upstream.url) })).status).toBe(200)
      expect((await post(`${gw.url}/payments/1/capture`, '4')).status).toBe(200)
      expect(upstream.received.at(-1)!.headers.authorization).toBe('Bearer file-only-secret')
    } finally {
      await foreign.close()
    }
  })

  it('applies a new route at once on the instance that took the change, and records who and when', async () => {
    expect((await post(`${gw.url}/refunds/7`, '1')).status).toBe(404)
    const put = await admin(gw.adminUrl, '/rules/refunds', { method: 'PUT', body: route(upstream.url, { name: 'refunds', path: '/refunds/:invoice_id' }) })
    expect(put.status).toBe(200)
    expect(put.json).toMatchObject({ name: 'refunds', version: 3, changed: true })
    const res = await post(`${gw.url}/refunds/7`, '1')
    expect(res.status).toBe(200)
    expect(log.lines.find((l) => l.event === 'request' && l.fields.route === 'refunds')?.fields.rule_version).toBe(3)
    const history = await admin(gw.adminUrl, '/rules/refunds/history')
    expect(history.json.items).toEqual([expect.objectContaining({ version: 3, name: 'refunds', kind: 'route', source: 'api', changed_at: expect.stringMatching(/Z$/) })])
    // The answers are the ones the OpenAPI document describes.
    expect(ruleChangedSchema.parse(put.json)).toBeTruthy()
    expect(ruleHistorySchema.parse(history.json)).toBeTruthy()
    expect(ruleSetSchema.parse((await admin(gw.adminUrl, '/rules')).json)).toBeTruthy()
    expect(ruleOneSchema.parse((await admin(gw.adminUrl, '/rules/refunds')).json)).toBeTruthy()
    expect(ruleDeletedSchema.parse((await admin(gw.adminUrl, '/rules/refunds', { method: 'DELETE' })).json)).toBeTruthy()
  })

  it('a route put through the rules API reads its key by its idempotency_key template, and idempotency_payload applies', async () => {
    const put = await admin(gw.adminUrl, '/rules/reports', { method: 'PUT', body: route(upstream.url, {
      name: 'reports', path: '/reports', entity: undefined, fence: 'off', idempotency: 'required',
      idempotency_key: 'report:{body.report_type}:{body.period}', idempotency_payload: 'key',
    }) })
    expect(put.status).toBe(200)
    expect((await admin(gw.adminUrl, '/rules/reports')).json.rule).toMatchObject({ idempotency_key: 'report:{body.report_type}:{body.period}', idempotency_payload: 'key' })
    const ask = (at: string) => post(`${gw.url}/reports`, undefined, { body: JSON.stringify({ report_type: 'sales', period: '2026-08', requested_at: at }) })
    expect((await ask('10:00')).status).toBe(200)
    expect((await ask('10:05')).headers.get('idempotent-replayed')).toBe('true')
    expect(upstream.received.filter((r) => r.path === '/reports')).toHaveLength(1)
    const unnamed = await post(`${gw.url}/reports`, undefined, { body: '{"report_type":"sales"}' })
    expect([unnamed.status, unnamed.json.code]).toEqual([400, 'idempotency_key_required'])
  })

  it('changing idempotency_payload or idempotency_key on a live route: an earlier key\'s duplicate is refused, or a new operation', async () => {
    const reports = (extra: Record<string, unknown>) => route(upstream.url, { name: 'reports', path: '/reports', entity: undefined, fence: 'off', idempotency: 'required', idempotency_key: 'report:{body.report_type}:{body.period}', ...extra })
    expect((await admin(gw.adminUrl, '/rules/reports', { method: 'PUT', body: reports({ idempotency_payload: 'key' }) })).status).toBe(200)
    const body = JSON.stringify({ report_type: 'sales', period: '2026-08', requested_at: '10:00' })
    expect((await post(`${gw.url}/reports`, undefined, { body })).status).toBe(200)
    // The stored record names the operation by the old payload rule: the same request no longer matches it.
    expect((await admin(gw.adminUrl, '/rules/reports', { method: 'PUT', body: reports({ idempotency_payload: 'request' }) })).status).toBe(200)
    const refused = await post(`${gw.url}/reports`, undefined, { body })
    expect([refused.status, refused.json.code]).toEqual([422, 'idempotency_key_reused'])
    // Another template reads another key from the same request: a new operation, forwarded again.
    expect((await admin(gw.adminUrl, '/rules/reports', { method: 'PUT', body: reports({ idempotency_key: 'r:{body.report_type}:{body.period}' }) })).status).toBe(200)
    expect((await post(`${gw.url}/reports`, undefined, { body })).headers.get('idempotent-replayed')).toBeNull()
    expect(upstream.received.filter((r) => r.path === '/reports')).toHaveLength(2)
  })

  it('a rule changes the error envelope of every refusal on its route', async () => {
    expect((await post(`${gw.url}/payments/5/capture`, '9')).status).toBe(200)
    const stale = async () => (await post(`${gw.url}/payments/5/capture`, '8')).json as Record<string, unknown>
    expect(await stale()).toMatchObject({ code: 'stale_fence', error: { code: 'stale_fence' } })
    const put = await admin(gw.adminUrl, '/rules/capture', { method: 'PUT', body: route(upstream.url, { error_envelope: 'square' }) })
    expect(put.status).toBe(200)
    const square = await stale()
    expect(square).toMatchObject({ code: 'stale_fence', errors: [{ category: 'INVALID_REQUEST_ERROR', code: 'STALE_FENCE' }] })
    expect(square.error).toBeUndefined()
    expect((await admin(gw.adminUrl, '/rules/capture')).json.rule.error_envelope).toBe('square')
    // Through Node's own listener too, a client that asks for JSON (node-zendesk does) gets it as JSON.
    const asJson = await post(`${gw.url}/payments/5/capture`, '8', { headers: { accept: 'application/json' } })
    expect([asJson.status, asJson.headers.get('content-type'), asJson.json.code]).toEqual([409, 'application/json', 'stale_fence'])
  })

  it('answers an unchanged rule without a new version', async () => {
    const rule = (await admin(gw.adminUrl, '/rules/tickets')).json.rule
    const again = await admin(gw.adminUrl, '/rules/tickets', { method: 'PUT', body: rule })
    expect(again.json).toMatchObject({ version: 2, changed: false })
  })

  it.each([
    ['a field the schema refuses', { fence: 'sometimes' }, 'fence'],
    ['upstream credentials', { upstream_headers: { Authorization: 'Bearer x' } }, 'upstream_headers'],
    ['upstream TLS files', { upstream: 'https://psp.example.com', upstream_tls: { ca_file: '/etc/ssl/psp.pem' } }, 'upstream_tls'],
    ['the callers\' tokens passed on', { forward_authorization: true }, 'forward_authorization'],
    ['a second route for the same requests', { path: '/payments/:other/capture', entity: 'invoice:{params.other}' }, 'another route already matches'],
    ['an entity template naming a missing param', { entity: 'invoice:{params.nope}' }, 'params.nope'],
    ['a key template naming a missing param', { path: '/bad/:invoice_id', idempotency: 'required', idempotency_key: 'k:{params.nope}' }, 'idempotency_key: uses params.nope'],
    ['tenant_scoped with a body key', { path: '/bad/:invoice_id', idempotency: 'required', idempotency_key: '{body.k}', upstream_key: 'tenant_scoped' }, 'upstream_key: tenant_scoped replaces the header'],
  ])('refuses %s with 422 invalid_rule and changes nothing', async (_what, override, mentions) => {
    const res = await admin(gw.adminUrl, '/rules/bad', { method: 'PUT', body: route(upstream.url, { name: 'bad', ...override }) })
    expect(res.status).toBe(422)
    expect(res.json.code).toBe('invalid_rule')
    expect(res.json.problems.join('\n')).toContain(mentions)
    expect((await admin(gw.adminUrl, '/rules')).json.version).toBe(2)
  })

  it.each([
    ['not JSON', '{'],
    ['an array', '[]'],
    ['another name than the path', JSON.stringify({ name: 'other' })],
  ])('refuses a body that is %s', async (_what, body) => {
    const res = await admin(gw.adminUrl, '/rules/bad', { method: 'PUT', body })
    expect(res.status).toBe(422)
    expect(res.json.code).toBe('invalid_rule')
  })

  it('refuses a change based on an older version (If-Match) with 412', async () => {
    const res = await admin(gw.adminUrl, '/rules/tickets', { method: 'DELETE', headers: { 'if-match': '"1"' } })
    expect(res.status).toBe(412)
    expect(res.json).toMatchObject({ code: 'rules_version_conflict', version: 2 })
    const ok = await admin(gw.adminUrl, '/rules/tickets', { method: 'DELETE', headers: { 'if-match': '"2"' } })
    expect(ok.json).toMatchObject({ version: 3, deleted: true })
  })

  it('deletes a route, and a restart with the same file does not bring it back', async () => {
    expect((await admin(gw.adminUrl, '/rules/tickets', { method: 'DELETE' })).status).toBe(200)
    expect((await post(`${gw.url}/tickets/1`)).status).toBe(404)
    expect((await admin(gw.adminUrl, '/rules/tickets', { method: 'DELETE' })).status).toBe(404)
    await stop()
    await start()
    expect((await post(`${gw.url}/tickets/1`)).status).toBe(404)
    expect(log.lines.some((l) => l.event === 'rule_differs_from_file' && l.fields.rule === 'tickets')).toBe(true)
    const history = (await admin(gw.adminUrl, '/rules/tickets/history')).json.items
    expect(history.map((h: { version: number; rule: unknown }) => [h.version, h.rule === null])).toEqual([[3, true], [2, false]])
  })

  it('updates a rule that came from the file when the file changes, but keeps an operator change', async () => {
    await admin(gw.adminUrl, '/rules/capture', { method: 'PUT', body: route(upstream.url, { timeout_ms: 1234 }) })
    await stop()
    await start(testConfig([
      route(upstream.url, { timeout_ms: 9999 }),
      route(upstream.url, { name: 'tickets', path: '/tickets/:id', entity: 'ticket:{params.id}', fence: 'required' }),
    ]))
    const rules = (await admin(gw.adminUrl, '/rules')).json.rules as { name: string; timeout_ms: number; fence: string }[]
    expect(rules.find((r) => r.name === 'capture')!.timeout_ms).toBe(1234)
    expect(rules.find((r) => r.name === 'tickets')!.fence).toBe('required')
  })

  it('serialises concurrent changes: of 20 routes claiming the same requests exactly one is accepted', async () => {
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) =>
      admin(gw.adminUrl, `/rules/r${i}`, { method: 'PUT', body: route(upstream.url, { name: `r${i}`, path: '/same/:invoice_id' }) })))
    expect(results.filter((r) => r.status === 200)).toHaveLength(1)
    expect(results.filter((r) => r.status === 422)).toHaveLength(19)
    expect((await admin(gw.adminUrl, '/rules')).json.version).toBe(3)
  })

  it('freezes an entity by pattern: 423 entity_frozen, audited, nothing forwarded; unfreezing lets it through', async () => {
    await admin(gw.adminUrl, '/rules/freeze', { method: 'PUT', body: { entity_match: 'invoice:4*', frozen: true } })
    const res = await post(`${gw.url}/payments/42/capture`, '5')
    expect(res.status).toBe(423)
    expect(res.json).toMatchObject({ code: 'entity_frozen', entity: 'invoice:42', rule: 'freeze' })
    expect((await post(`${gw.url}/payments/42/capture`)).status).toBe(423)
    expect((await post(`${gw.url}/payments/52/capture`, '5')).status).toBe(200)
    expect(upstream.received.map((r) => r.path)).toEqual(['/payments/52/capture'])
    const audit = (await admin(gw.adminUrl, '/audit?code=entity_frozen')).json.items
    expect(audit).toEqual([expect.objectContaining({ entity: 'invoice:42', code: 'entity_frozen' }), expect.objectContaining({ entity: 'invoice:42' })])
    await admin(gw.adminUrl, '/rules/freeze', { method: 'DELETE' })
    expect((await post(`${gw.url}/payments/42/capture`, '5')).status).toBe(200)
  })

  it('refuses a frozen entity even a replay of a completed key', async () => {
    const keyed = { headers: { 'idempotency-key': 'done' } }
    await admin(gw.adminUrl, '/rules/capture', { method: 'PUT', body: route(upstream.url, { idempotency: 'optional' }) })
    expect((await post(`${gw.url}/payments/42/capture`, '5', keyed)).status).toBe(200)
    await admin(gw.adminUrl, '/rules/freeze', { method: 'PUT', body: { entity_match: 'invoice:42', frozen: true } })
    expect((await post(`${gw.url}/payments/42/capture`, '5', keyed)).status).toBe(423)
  })

  it('keeps the rules in use when a newer version cannot be loaded, and says so', async () => {
    await t.db.sql`INSERT INTO fg_rule_versions (version, name, kind, rule, source) VALUES (3, 'broken', 'route', '{"name": "broken", "method": "FETCH"}'::jsonb, 'api')`
    await registry.refresh()
    expect(registry.current().version).toBe(2)
    expect(log.lines.some((l) => l.event === 'rules_reload_failed')).toBe(true)
    expect((await post(`${gw.url}/payments/1/capture`, '1')).status).toBe(200)
  })

  it('finds a change by the periodic version check when no notification arrives', async () => {
    // A Db without listen: only the version check can bring the change.
    const deaf = await startRuleRegistry({ db: { ...t.db, listen: undefined }, config, log: memoryLog(), checkEveryMs: 10 })
    try {
      await registry.change({ name: 'freeze', rule: { name: 'freeze', entity_match: 'x:*', frozen: true }, changedBy: null, source: 'api' })
      await new Promise<void>((resolve) => {
        const poll = () => (deaf.current().version === 3 ? resolve() : void setTimeout(poll, 5))
        poll()
      })
      expect(deaf.current().entityRules).toHaveLength(1)
    } finally {
      await deaf.close()
    }
  })

  it('freezes only the named tenant when a rule names one', async () => {
    await admin(gw.adminUrl, '/rules/freeze', { method: 'PUT', body: { entity_match: 'invoice:*', tenant: 'other', frozen: true } })
    expect((await post(`${gw.url}/payments/42/capture`, '5')).status).toBe(200)
  })

  it('overrides the fence mode for matching entities, the most specific rule winning', async () => {
    await admin(gw.adminUrl, '/rules/vip', { method: 'PUT', body: { entity_match: 'ticket:vip-*', fence: 'required' } })
    await admin(gw.adminUrl, '/rules/vip-gold', { method: 'PUT', body: { entity_match: 'ticket:vip-gold-*', fence: 'optional' } })
    expect((await post(`${gw.url}/tickets/plain`)).status).toBe(200)
    const vip = await post(`${gw.url}/tickets/vip-1`)
    expect(vip.status).toBe(428)
    expect(vip.json.code).toBe('fence_required')
    expect((await post(`${gw.url}/tickets/vip-gold-1`)).status).toBe(200)
  })

  it('refuses an entity rule that sets nothing, and a name a route already has', async () => {
    expect((await admin(gw.adminUrl, '/rules/idle', { method: 'PUT', body: { entity_match: 'x:*' } })).json.code).toBe('invalid_rule')
    const clash = await admin(gw.adminUrl, '/rules/capture', { method: 'PUT', body: { entity_match: 'x:*', frozen: true } })
    expect(clash.status).toBe(200)
    // The route of that name was replaced by the entity rule: one namespace, one rule per name.
    expect((await post(`${gw.url}/payments/1/capture`, '1')).status).toBe(404)
  })
})

describe('rules across gateway instances (postgres)', () => {
  const pg = backends().find((b) => b.name === 'postgres')
  it.skipIf(!pg)('a change made on one instance is applied by another through NOTIFY alone', async () => {
    const t = await pg!.open()
    const upstream = await startUpstream()
    const config = testConfig([route(upstream.url)])
    // The periodic check is an hour away: only the notification can deliver the change in time.
    const a = await startRuleRegistry({ db: t.db, config, log: memoryLog(), checkEveryMs: 3_600_000 })
    const b = await startRuleRegistry({ db: t.db, config, log: memoryLog(), checkEveryMs: 3_600_000 })
    try {
      expect(b.current().version).toBe(1)
      const changed = new Promise<void>((resolve) => {
        const poll = () => (b.current().version === 2 ? resolve() : void setTimeout(poll, 5))
        poll()
      })
      await a.change({ name: 'freeze', rule: { name: 'freeze', entity_match: 'invoice:1', frozen: true }, changedBy: 'ops', source: 'api' })
      await changed
      expect(b.current().entityRules.map((r) => r.config.name)).toEqual(['freeze'])
    } finally {
      await a.close()
      await b.close()
      await upstream.close()
      await t.close()
    }
  })
})

describe('closing the rule registry', () => {
  for (const backend of backends()) {
    it(`closes even when its UNLISTEN fails (${backend.name}): a throw here once skipped closing the store`, async () => {
      const t = await backend.open()
      try {
        const lines: string[] = []
        // A LISTEN whose UNLISTEN is cut off with its connection, as after a backend termination.
        const db = { ...t.db, listen: async () => async () => { throw new StoreError(undefined, 'CONNECTION_CLOSED') } }
        const registry = await startRuleRegistry({ db, config: testConfig([route('http://127.0.0.1:9')]), log: createLogger('info', (l) => lines.push(l)) })
        await expect(registry.close()).resolves.toBeUndefined()
        expect(lines.map((l) => JSON.parse(l) as { event: string; store_code?: string })).toContainEqual(expect.objectContaining({ event: 'rules_unlisten_failed', store_code: 'CONNECTION_CLOSED' }))
      } finally {
        await t.close()
      }
    })
  }
})
