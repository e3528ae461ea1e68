import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createAdminApp } from '../src/admin/app.js'
import { noAuthentication } from '../src/http/identity.js'
import { ruleHistory } from '../src/rules/store.js'
import { backends, type TestDb } from './helpers/backends.js'

/**
 * Regression: `GET /audit` and rule history selected `id::text AS id` (and `version::text AS
 * version`) and ordered by that name, which PostgreSQL resolves to the text alias: ids sorted
 * as strings (999 before 2514) while the cursor compared numbers, so pages skipped and repeated
 * rows. These page across digit boundaries and require every row exactly once, newest first.
 */
describe.each(backends())('keyset paging on $name', (backend) => {
  let t: TestDb
  const rows = 2514

  beforeAll(async () => {
    t = await backend.open()
    await t.db.sql`
      INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence, method, path, body_sha256, caller, request_id, idempotency_key)
      SELECT 'default', 'capture', 'invoice:' || (n % 10), CASE WHEN n % 5 = 0 THEN 'fence_required' ELSE 'stale_fence' END,
             1, 2, 'POST', '/payments/1/capture', NULL, NULL, 'req-' || n, NULL
      FROM generate_series(1, ${rows}::integer) AS n`
  })
  afterAll(() => t.close())

  async function pageAll(filter: string): Promise<string[]> {
    const admin = createAdminApp({ store: t.store, authenticate: noAuthentication })
    const ids: string[] = []
    let cursor: string | null = null
    for (let page = 0; page < 100; page++) {
      const res = await admin.request(`/audit?limit=100${filter}${cursor ? `&cursor=${cursor}` : ''}`)
      expect(res.status).toBe(200)
      const body = await res.json() as { items: { id: string }[]; next_cursor: string | null }
      ids.push(...body.items.map((i) => i.id))
      cursor = body.next_cursor
      if (!cursor) return ids
    }
    throw new Error('more than 100 pages')
  }

  it('pages the whole audit trail: every row once, newest first', async () => {
    const [{ ids }] = await t.db.sql<{ ids: string }>`SELECT string_agg(id::text, ',' ORDER BY id DESC) AS ids FROM fg_audit`
    const ids0 = ids.split(',')
    expect(ids0).toHaveLength(rows)
    expect(await pageAll('')).toEqual(ids0)
  })

  it('pages a filtered trail the same way', async () => {
    const [{ ids }] = await t.db.sql<{ ids: string }>`
      SELECT string_agg(id::text, ',' ORDER BY id DESC) AS ids FROM fg_audit WHERE code = 'stale_fence'`
    expect(await pageAll('&code=stale_fence')).toEqual(ids.split(','))
  })

  it('lists rule history by version as a number (22 before 6)', async () => {
    await t.db.sql`
      INSERT INTO fg_rule_versions (version, name, kind, rule, changed_by, source)
      SELECT v, 'capture', 'route', NULL, 'test', 'api' FROM generate_series(1, 22) AS v WHERE v IN (6, 9, 10, 22)`
    expect((await ruleHistory(t.db, 'capture', 1)).map((c) => c.version)).toEqual([22])
    expect((await ruleHistory(t.db, 'capture', 10)).map((c) => c.version)).toEqual([22, 10, 9, 6])
  })
})
