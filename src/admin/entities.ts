import { Hono } from 'hono'
import { isStorableText, maxEntityLength } from '../gateway/route.js'
import { FencegateError } from '../http/problems.js'
import type { Store } from '../store/store.js'
import { traceIdOf } from '../observe/tracing.js'
import { parseBump, parseTenantQuery, storeCall, tenantFor, type AdminEnv } from './query.js'

/**
 * The admin plane's entity state and its incident response (fencegate:admin): an entity's
 * highest fence, and the bump that cuts off every holder of a token below `min_fence` at
 * once. Mounted by createAdminApp, whose middleware set the identity and the request id.
 *
 * @example
 * app.route('/', createEntitiesApp(store))
 */
export function createEntitiesApp(store: Store): Hono<AdminEnv> {
  const app = new Hono<AdminEnv>()

  app.get('/entities/:entity', async (c) => {
    const entity = c.req.param('entity')
    const tenant = tenantFor(c.get('identity'), parseTenantQuery(c.req.url), false) ?? 'default'
    const state = await storeCall(() => store.getEntity(tenant, entity))
    if (!state) throw new FencegateError('not_found', `no fence has been accepted for ${entity} in tenant ${tenant}`)
    return c.json(state)
  })

  app.post('/entities/:entity/bump', async (c) => {
    const entity = c.req.param('entity')
    if (entity.length > maxEntityLength || !isStorableText(entity)) throw new FencegateError('invalid_request', `an entity is 1-${maxEntityLength} characters without control characters`)
    const tenant = tenantFor(c.get('identity'), parseTenantQuery(c.req.url), false) ?? 'default'
    const minFence = parseBump(await c.req.text())
    const r = await storeCall(() => store.bumpFence({ tenant, entity, minFence, caller: c.get('identity').caller, requestId: c.get('requestId'), traceId: traceIdOf(c.get('span')) }))
    return c.json({ tenant, entity, previous_fence: r.previous, highest_fence: r.highest, raised: r.raised })
  })

  return app
}
