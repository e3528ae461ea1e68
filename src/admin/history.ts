import { Hono } from 'hono'
import { entityPageSchema, keysetPage, parseAuditSummaryQuery, parseQuery, storeCall, tenantFor, type AdminEnv } from './query.js'
import type { Store } from '../store/store.js'

/** One page of an entity's fence history: `next_cursor` is null on the last page. */
export interface FenceHistoryPage {
  items: Awaited<ReturnType<Store['listFenceHistory']>>
  next_cursor: string | null
}

/**
 * The admin plane's read views for the audit console: an entity's fence
 * history and recent idempotency records (fencegate:admin, as GET /entities/{e}),
 * and rejections counted by code over time (fencegate:admin or fencegate:audit,
 * as GET /audit). Mounted by createAdminApp, whose middleware set the identity.
 *
 * @example
 * app.route('/', createHistoryApp(store))
 */
export function createHistoryApp(store: Store): Hono<AdminEnv> {
  const app = new Hono<AdminEnv>()

  app.get('/entities/:entity/history', async (c) => {
    const p = parseQuery(entityPageSchema, new URL(c.req.url).searchParams)
    const tenant = tenantFor(c.get('identity'), p.tenant, false) ?? 'default'
    const limit = p.limit === undefined ? 100 : Number(p.limit)
    const page = await storeCall(() => keysetPage(limit, (n) => store.listFenceHistory({ tenant, entity: c.req.param('entity'), limit: n, before: p.before }), (item) => item.id))
    return c.json(page satisfies FenceHistoryPage)
  })

  app.get('/entities/:entity/keys', async (c) => {
    const p = parseQuery(entityPageSchema.omit({ before: true }), new URL(c.req.url).searchParams)
    const tenant = tenantFor(c.get('identity'), p.tenant, false) ?? 'default'
    const items = await storeCall(() => store.listEntityKeys(tenant, c.req.param('entity'), p.limit === undefined ? 100 : Number(p.limit)))
    return c.json({ items })
  })

  app.get('/audit/summary', async (c) => {
    const { filter, bucketMs } = parseAuditSummaryQuery(new URL(c.req.url).searchParams)
    filter.tenant = tenantFor(c.get('identity'), filter.tenant, true)
    return c.json({ bucket_ms: bucketMs, buckets: await storeCall(() => store.summarizeAudit(filter, bucketMs)) })
  })

  return app
}
