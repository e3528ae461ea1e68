import { Hono } from 'hono'
import { routePath } from 'hono/route'
import { z } from 'zod'
import { requestIdOf } from './app.js'
import { noAuthentication, type Authenticate, type Identity } from './identity.js'
import { parseDuration } from './config/units.js'
import { maxFence, parseFence } from './fence.js'
import { noMetrics, type Metrics, type MetricsExposition } from './metrics.js'
import { adminOpenApi } from './openapi.js'
import { isStorableText, maxEntityLength } from './route.js'
import { FencegateError, problemResponse } from './problems.js'
import type { AuditItem, AuditQuery, Store } from './store/store.js'
import { createRulesApp } from './rules/api.js'
import { createConsoleApp } from './admin-ui.js'
import type { RuleRegistry } from './rules/registry.js'
import type { Db } from './store/db.js'

export interface AdminDeps {
  store: Store
  /** Defaults to no authentication, for an admin plane bound to loopback. */
  authenticate?: Authenticate
  /** Counts admin requests; defaults to recording nothing. */
  metrics?: Metrics
  /** What `GET /metrics` serves; without it the endpoint does not exist (404). */
  exposition?: MetricsExposition
  /** Rules kept in the database; without them `/rules` does not exist (404). */
  rules?: { registry: RuleRegistry; db: Db }
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
 * Builds the admin-plane Hono app: health, the audit trail, entity state,
 * idempotency records, metrics and its own OpenAPI description.
 * With `auth.mode: jwt` every endpoint but /health needs a token (and all but
 * /openapi.json an admin scope); without auth the configuration only lets it listen on loopback.
 *
 * @example
 * const admin = createAdminApp({ store })
 * const page = await (await admin.request('/audit?code=stale_fence&limit=50')).json()
 */
export function createAdminApp(deps: AdminDeps): Hono<AdminEnv> {
  const { store, exposition } = deps
  const authenticate = deps.authenticate ?? noAuthentication
  const metrics = deps.metrics ?? noMetrics
  const app = new Hono<AdminEnv>()
  // Outermost, so it also sees answers made by onError (a refused token, an unknown endpoint).
  app.use(async (c, next) => {
    await next()
    const endpoint = routePath(c, -1)
    metrics.adminRequest({ endpoint: endpoint === '/*' ? 'unmatched' : endpoint, status: c.res.status })
  })
  // The console's static files hold no tenant data: served before authentication, so the page can ask for a token.
  app.route('/ui', createConsoleApp())
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

  app.get('/metrics', async (c) => {
    if (!exposition) throw new FencegateError('not_found', 'no such admin endpoint')
    tenantFor(c.get('identity'), undefined, false)
    return c.body(await exposition.render(), 200, { 'content-type': exposition.contentType })
  })

  app.get('/openapi.json', (c) => c.json(adminOpenApi()))

  app.get('/entities/:entity', async (c) => {
    const entity = c.req.param('entity')
    const tenant = tenantFor(c.get('identity'), parseTenantQuery(c.req.url), false) ?? 'default'
    const state = await storeCall(() => store.getEntity(tenant, entity))
    if (!state) throw new FencegateError('not_found', `no fence has been accepted for ${entity} in tenant ${tenant}`)
    return c.json(state)
  })

  // Incident response: every holder of a token below min_fence is cut off at once.
  app.post('/entities/:entity/bump', async (c) => {
    const entity = c.req.param('entity')
    if (entity.length > maxEntityLength || !isStorableText(entity)) throw new FencegateError('invalid_request', `an entity is 1-${maxEntityLength} characters without control characters`)
    const tenant = tenantFor(c.get('identity'), parseTenantQuery(c.req.url), false) ?? 'default'
    const minFence = parseBump(await c.req.text())
    const r = await storeCall(() => store.bumpFence({ tenant, entity, minFence, caller: c.get('identity').caller, requestId: c.get('requestId') }))
    return c.json({ tenant, entity, previous_fence: r.previous, highest_fence: r.highest, raised: r.raised })
  })

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
    const result = await storeCall(() => store.releaseUnknown({ tenant, key, caller: c.get('identity').caller, requestId: c.get('requestId') }))
    if (!result) throw new FencegateError('not_found', `no live record for this Idempotency-Key in tenant ${tenant}`)
    if (!result.released) throw new FencegateError('key_not_releasable', `the record is ${result.state}; only an unknown outcome (or an in-flight record whose lock expired) can be released`, { state: result.state })
    return c.json({ key, tenant, released: true, previous_state: result.state })
  })

  if (deps.rules) app.route('/rules', createRulesApp(deps.rules))

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

/** A duration back from the database's now (`1h`, `15m`), in milliseconds, or undefined. */
function windowMs(value: string): number | undefined {
  const ms = /^\d+(ms|s|m|h|d)$/.test(value) ? parseDuration(value) : undefined
  return ms !== undefined && ms <= maxWindowMs ? ms : undefined
}

const windowBound = (name: string) => z.string()
  .regex(/^[\s\S]{1,64}$/, 'an ISO-8601 time or a duration such as 1h')
  .refine((v) => windowMs(v) !== undefined || isZonedTimestamp(v), 'an ISO-8601 time with a zone (2026-11-29T10:00:00Z) or a duration such as 1h')
  .optional()
  .describe(`Rows at or ${name === 'since' ? 'after' : 'before'} this time: an ISO-8601 time with a zone, or a duration back from the database's now (ms, s, m, h, d)`)

const tenantParam = z.string().regex(/^[\s\S]{1,128}$/, '1-128 characters')
  .optional().describe('The tenant to act on (fencegate:admin only; default: the token\'s tenant, or every tenant for /audit)')

/** `/audit` query parameters: the schema the endpoint validates with and the OpenAPI document shows. */
export const auditQuerySchema = z.object({
  tenant: tenantParam,
  entity: z.string().regex(new RegExp(`^[\\s\\S]{1,${maxEntityLength}}$`), `1-${maxEntityLength} characters`).optional().describe('Only rows about this entity'),
  code: z.string().regex(/^[a-z_]{1,64}$/, 'an error code such as stale_fence').optional().describe('Only rows with this problem code'),
  route: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, 'a route name').optional().describe('Only rows for this route'),
  since: windowBound('since'),
  until: windowBound('until'),
  limit: z.string().regex(/^[0-9]{1,4}$/, 'an integer from 1 to 1000')
    .refine((v) => Number(v) >= 1 && Number(v) <= 1000, 'an integer from 1 to 1000').optional().describe('Page size, 1 to 1000 (default 100)'),
  // The refine guards itself: zod runs refinements even after the pattern failed.
  cursor: z.string().regex(/^[0-9]{1,19}$/, 'a next_cursor value from an earlier page')
    .refine((v) => /^[0-9]{1,19}$/.test(v) && BigInt(v) <= maxFence, 'a next_cursor value from an earlier page').optional()
    .describe('The next_cursor of the previous page'),
}).strict()

/** `?tenant=` on `/entities/{entity}` and `/idempotency/{key}`. */
export const tenantQuerySchema = z.object({ tenant: tenantParam }).strict()

/** Validates query parameters against a schema: unknown names first, then repeats, then values. */
function parseQuery<S extends z.ZodObject>(schema: S, params: URLSearchParams): z.output<S> {
  const known = new Set(Object.keys(schema.shape))
  for (const name of params.keys()) {
    if (!known.has(name)) throw new FencegateError('invalid_query', `unknown parameter ${name}`, { parameter: name })
  }
  for (const name of known) {
    if (params.getAll(name).length > 1) throw new FencegateError('invalid_query', `${name} must be given once`, { parameter: name })
  }
  const parsed = schema.safeParse(Object.fromEntries(params))
  if (parsed.success) return parsed.data
  const issue = parsed.error.issues[0]!
  const name = String(issue.path[0])
  throw new FencegateError('invalid_query', `${name} must be ${issue.message}`, { parameter: name })
}

function parseTenantQuery(url: string): string | undefined {
  return parseQuery(tenantQuerySchema, new URL(url).searchParams).tenant
}

/**
 * Validates `/audit` query parameters with `auditQuerySchema`. `since`/`until`
 * take an ISO-8601 time or a duration back from the database's now (`1h`, `15m`).
 *
 * @example
 * const query = parseAuditQuery(new URLSearchParams('code=stale_fence&since=1h'))
 */
export function parseAuditQuery(params: URLSearchParams): AuditQuery {
  const p = parseQuery(auditQuerySchema, params)
  const query: AuditQuery = { limit: p.limit === undefined ? 100 : Number(p.limit) }
  query.tenant = p.tenant
  query.entity = p.entity
  query.code = p.code
  query.route = p.route
  query.before = p.cursor
  for (const bound of ['since', 'until'] as const) {
    const value = p[bound]
    if (value === undefined) continue
    const ms = windowMs(value)
    if (ms === undefined) query[bound] = value
    else if (bound === 'since') query.sinceMs = ms
    else query.untilMs = ms
  }
  return query
}

/** The body of `POST /entities/{entity}/bump`: what `parseBump` accepts and the OpenAPI document describes. */
export const bumpRequestSchema = z.object({
  min_fence: z.union([
    z.string().regex(/^[0-9]{1,19}$/).describe('A fence: a decimal integer, as a string (it may exceed 2^53)'),
    z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  ]).describe('The new floor: every fence below it is stale from now on'),
}).strict()

/** `{"min_fence": "43"}` (a number is accepted too, up to 2^53): the floor, as a canonical decimal string. */
export function parseBump(text: string): string {
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    throw new FencegateError('invalid_request', 'the body must be JSON: {"min_fence": "43"}')
  }
  const parsed = bumpRequestSchema.safeParse(body)
  if (!parsed.success) throw new FencegateError('invalid_request', 'the body must be {"min_fence": "<decimal fence>"}')
  try {
    return parseFence(String(parsed.data.min_fence))!
  } catch {
    throw new FencegateError('invalid_request', 'min_fence must be a decimal integer between 0 and 9223372036854775807')
  }
}
