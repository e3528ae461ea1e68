import { Hono } from 'hono'
import { FencegateError } from '../http/problems.js'
import type { Store } from '../store/store.js'
import { traceIdOf } from '../observe/tracing.js'
import { parseTenantQuery, storeCall, tenantFor, type AdminEnv } from './query.js'

/**
 * The admin plane's idempotency records (fencegate:admin): one live record by its key, and
 * the release of an unknown outcome, so that the next duplicate forwards again. Mounted by
 * createAdminApp, whose middleware set the identity and the request id.
 *
 * @example
 * app.route('/', createKeysApp(store))
 */
export function createKeysApp(store: Store): Hono<AdminEnv> {
  const app = new Hono<AdminEnv>()

  app.get('/idempotency/:key', async (c) => {
    const key = c.req.param('key')
    const tenant = tenantFor(c.get('identity'), parseTenantQuery(c.req.url), false) ?? 'default'
    const record = await storeCall(() => store.getKey(tenant, key))
    if (!record) throw new FencegateError('not_found', `no live record for this Idempotency-Key in tenant ${tenant}`)
    return c.json(record)
  })

  app.delete('/idempotency/:key', async (c) => {
    const key = c.req.param('key')
    const tenant = tenantFor(c.get('identity'), parseTenantQuery(c.req.url), false) ?? 'default'
    const result = await storeCall(() => store.releaseUnknown({ tenant, key, caller: c.get('identity').caller, requestId: c.get('requestId'), traceId: traceIdOf(c.get('span')) }))
    if (!result) throw new FencegateError('not_found', `no live record for this Idempotency-Key in tenant ${tenant}`)
    if (!result.released) throw new FencegateError('key_not_releasable', `the record is ${result.state}; only an unknown outcome (or an in-flight record whose lock expired) can be released`, { state: result.state })
    return c.json({ key, tenant, released: true, previous_state: result.state })
  })

  return app
}
