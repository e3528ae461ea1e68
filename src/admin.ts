import { Hono } from 'hono'
import { requestIdOf } from './app.js'
import { noAuthentication, type Authenticate, type Identity } from './identity.js'
import { parseDuration } from './config/units.js'
import { maxFence } from './fence.js'
import { maxEntityLength } from './route.js'
import { FencegateError, problemResponse } from './problems.js'
import type { AuditItem, AuditQuery, Store } from './store/store.js'

export interface AdminDeps {
  store: Store
  /** Defaults to no authentication, for an admin plane bound to loopback. */
  authenticate?: Authenticate
}

type AdminEnv = { Variables: { requestId: string; identity: Identity } }

const adminScope = 'fencegate:admin'
const auditScope = 'fencegate:audit'

/**
 * The tenant an admin request may act on. `fencegate:admin` may name any tenant
 * (`?tenant=`); `fencegate:audit` reads only its own tenant's audit trail.
 * Without authentication (scopes null) the loopback-bound operator may do anything.
 */
function tenantFor(identity: Identity, requested: string | undefined, auditOnly: boolean): string | undefined {
  if (identity.scopes === null || identity.scopes.has(adminScope)) return auditOnly ? requested : (requested ?? identity.tenant)
  if (auditOnly && identity.scopes.has(auditScope)) {
    if (requested !== undefined && requested !== identity.tenant) throw new FencegateError('insufficient_scope', `${auditScope} reads only its own tenant's audit trail`)
    return identity.tenant
  }
  throw new FencegateError('insufficient_scope', `this endpoint requires the ${auditOnly ? `${adminScope} or ${auditScope}` : adminScope} scope`)
}

/**
 * Builds the admin-plane Hono app: health, the audit trail and entity state.
 * With `auth.mode: jwt` every endpoint but /health needs a token with an admin scope;
 * without auth the configuration only lets it listen on loopback.
 *
 * @example
 * const admin = createAdminApp({ store })
 * const page = await (await admin.request('/audit?code=stale_fence&limit=50')).json()
 */
export function createAdminApp(deps: AdminDeps): Hono<AdminEnv> {
  const { store } = deps
  const authenticate = deps.authenticate ?? noAuthentication
  const app = new Hono<AdminEnv>()
  app.use(async (c, next) => {
    c.set('requestId', requestIdOf(c.req.raw))
    // Health is for load balancers and carries no tenant data; everything else needs an identity.
    if (c.req.path !== '/health') c.set('identity', await authenticate(c.req.raw))
    await next()
    c.header('x-request-id', c.get('requestId'))
  })

  app.get('/health', async (c) => {
    try {
      await store.ping()
      return c.json({ status: 'ok', store: 'up' })
    } catch {
      return c.json({ status: 'unavailable', store: 'down' }, 503)
    }
  })

  app.get('/audit', async (c) => {
    const query = parseAuditQuery(new URL(c.req.url).searchParams)
    query.tenant = tenantFor(c.get('identity'), query.tenant, true)
    return c.json(await storeCall(() => readAuditPage(store, query)))
  })

  app.get('/entities/:entity', async (c) => {
    const entity = c.req.param('entity')
    const tenant = tenantFor(c.get('identity'), c.req.query('tenant'), false) ?? 'default'
    const state = await storeCall(() => store.getEntity(tenant, entity))
    if (!state) throw new FencegateError('not_found', `no fence has been accepted for ${entity} in tenant ${tenant}`)
    return c.json(state)
  })

  app.get('/idempotency/:key', async (c) => {
    const key = c.req.param('key')
    const tenant = tenantFor(c.get('identity'), c.req.query('tenant'), false) ?? 'default'
    const record = await storeCall(() => store.getKey(tenant, key))
    if (!record) throw new FencegateError('not_found', `no live record for this Idempotency-Key in tenant ${tenant}`)
    return c.json(record)
  })

  app.delete('/idempotency/:key', async (c) => {
    const key = c.req.param('key')
    const tenant = tenantFor(c.get('identity'), c.req.query('tenant'), false) ?? 'default'
    const result = await storeCall(() => store.releaseUnknown({ tenant, key, caller: c.get('identity').caller, requestId: c.get('requestId') }))
    if (!result) throw new FencegateError('not_found', `no live record for this Idempotency-Key in tenant ${tenant}`)
    if (!result.released) throw new FencegateError('key_not_releasable', `the record is ${result.state}; only an unknown outcome (or an in-flight record whose lock expired) can be released`, { state: result.state })
    return c.json({ key, tenant, released: true, previous_state: result.state })
  })

  app.notFound(() => {
    throw new FencegateError('not_found', 'no such admin endpoint')
  })
  app.onError((err, c) => problemResponse(err instanceof FencegateError ? err : new FencegateError('internal_error'), c.get('requestId')))
  return app
}

/** One page of the audit trail: `next_cursor` is null on the last page. */
export interface AuditPage {
  items: AuditItem[]
  next_cursor: string | null
}

/** Reads one page, asking for one row more than the limit to know whether another page exists. */
export async function readAuditPage(store: Store, query: AuditQuery): Promise<AuditPage> {
  const rows = await store.listAudit({ ...query, limit: query.limit + 1 })
  const items = rows.slice(0, query.limit)
  return { items, next_cursor: rows.length > query.limit ? items.at(-1)!.id : null }
}

async function storeCall<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call()
  } catch (err) {
    if (err instanceof FencegateError) throw err
    throw new FencegateError('store_unavailable', 'the store could not be read')
  }
}

// A hundred years back from now stays far inside PostgreSQL's timestamp range.
const maxWindowMs = 100 * 365 * 86_400_000

/** An ISO-8601 time with a zone whose calendar date exists (JavaScript accepts 30 February; PostgreSQL does not). */
function isZonedTimestamp(value: string): boolean {
  const m = /^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2})(:(\d{2})(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})$/.exec(value)
  if (!m) return false
  const [year, month, day, hour, minute, second] = [m[1], m[2], m[3], m[4], m[5], m[7] ?? '0'].map(Number) as number[]
  const date = new Date(Date.UTC(year!, month! - 1, day!))
  return year! >= 1 && date.getUTCFullYear() === year && date.getUTCMonth() === month! - 1 && date.getUTCDate() === day
    && hour! < 24 && minute! < 60 && second! < 60
}

const auditParams = new Set(['tenant', 'entity', 'code', 'route', 'since', 'until', 'limit', 'cursor'])

/**
 * Validates `/audit` query parameters. `since`/`until` take an ISO-8601 time or
 * a duration back from the database's now (`1h`, `15m`).
 */
export function parseAuditQuery(params: URLSearchParams): AuditQuery {
  for (const name of params.keys()) {
    if (!auditParams.has(name)) throw new FencegateError('invalid_query', `unknown parameter ${name}`, { parameter: name })
  }
  const one = (name: string, pattern: RegExp, what: string): string | undefined => {
    const values = params.getAll(name)
    if (values.length === 0) return undefined
    if (values.length > 1 || !pattern.test(values[0]!)) throw new FencegateError('invalid_query', `${name} must be ${what}`, { parameter: name })
    return values[0]
  }
  const query: AuditQuery = { limit: 100 }
  query.tenant = one('tenant', /^.{1,128}$/s, '1-128 characters')
  query.entity = one('entity', new RegExp(`^.{1,${maxEntityLength}}$`, 's'), `1-${maxEntityLength} characters`)
  query.code = one('code', /^[a-z_]{1,64}$/, 'an error code such as stale_fence')
  query.route = one('route', /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, 'a route name')
  query.before = one('cursor', /^[0-9]{1,19}$/, 'a next_cursor value from an earlier page')
  if (query.before !== undefined && BigInt(query.before) > maxFence) throw new FencegateError('invalid_query', 'cursor must be a next_cursor value from an earlier page', { parameter: 'cursor' })
  const limit = one('limit', /^[0-9]{1,4}$/, 'an integer from 1 to 1000')
  if (limit !== undefined) {
    query.limit = Number(limit)
    if (query.limit < 1 || query.limit > 1000) throw new FencegateError('invalid_query', 'limit must be an integer from 1 to 1000', { parameter: 'limit' })
  }
  for (const bound of ['since', 'until'] as const) {
    const value = one(bound, /^.{1,64}$/, 'an ISO-8601 time or a duration such as 1h')
    if (value === undefined) continue
    const ms = /^\d+(ms|s|m|h|d)$/.test(value) ? parseDuration(value) : undefined
    if (ms !== undefined && ms <= maxWindowMs) {
      if (bound === 'since') query.sinceMs = ms
      else query.untilMs = ms
    } else if (isZonedTimestamp(value)) {
      query[bound] = value
    } else {
      throw new FencegateError('invalid_query', `${bound} must be an ISO-8601 time with a zone (2026-11-29T10:00:00Z) or a duration such as 1h`, { parameter: bound })
    }
  }
  return query
}
