import { z } from 'zod'
import { parseDuration } from '../config/units.js'
import { maxFence, parseFence } from '../gateway/fence.js'
import { adminScope, type Identity } from '../http/identity.js'
import { maxEntityLength } from '../gateway/route.js'
import { FencegateError, storeUnavailable } from '../http/problems.js'
import { StoreError } from '../store/db.js'
import type { OpenSpan } from '../observe/tracing.js'
import type { AuditFilter, AuditItem, AuditQuery, Store } from '../store/store.js'

/**
 * What every admin-plane module shares: the request's variables, the scope
 * rules that pick the tenant, store calls that fail as problems, and query
 * parameters validated against the schemas the OpenAPI document shows.
 */

/** `span` is the request's SERVER span (a no-op one when tracing is off): its trace id goes on the audit rows the request writes. */
export type AdminEnv = { Variables: { requestId: string; identity: Identity; span: OpenSpan; refusal: string } }

const auditScope = 'fencegate:audit'

/**
 * The tenant an admin request may act on. `fencegate:admin` may name any tenant
 * (`?tenant=`); `fencegate:audit` reads only its own tenant's audit trail.
 * Without authentication (scopes null) the loopback-bound operator may do anything.
 */
export function tenantFor(identity: Identity, requested: string | undefined, auditOnly: boolean): string | undefined {
  if (identity.scopes === null || identity.scopes.has(adminScope)) return auditOnly ? requested : (requested ?? identity.tenant)
  if (auditOnly && identity.scopes.has(auditScope)) {
    if (requested !== undefined && requested !== identity.tenant) throw new FencegateError('insufficient_scope', `${auditScope} reads only its own tenant's audit trail`)
    return identity.tenant
  }
  throw new FencegateError('insufficient_scope', `this endpoint requires the ${auditOnly ? `${adminScope} or ${auditScope}` : adminScope} scope`)
}

/** Runs a store call; a failing store is a retryable 503 problem, never a 500 (and a bug stays an internal_error). */
export async function storeCall<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call()
  } catch (err) {
    if (err instanceof StoreError) throw storeUnavailable('the store could not be read or written; nothing was changed')
    throw err
  }
}

/** Validates query parameters against a schema: unknown names first, then repeats, then values. */
export function parseQuery<S extends z.ZodObject>(schema: S, params: URLSearchParams): z.output<S> {
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

export const tenantParam = z.string().regex(/^[\s\S]{1,128}$/, '1-128 characters')
  .optional().describe('The tenant to act on (fencegate:admin only; default: the token\'s tenant, or every tenant for /audit)')

const limitParam = z.string().regex(/^[0-9]{1,4}$/, 'an integer from 1 to 1000')
  .refine((v) => Number(v) >= 1 && Number(v) <= 1000, 'an integer from 1 to 1000').optional().describe('Page size, 1 to 1000 (default 100)')

// The refine guards itself: zod runs refinements even after the pattern failed.
const cursorParam = z.string().regex(/^[0-9]{1,19}$/, 'a next_cursor value from an earlier page')
  .refine((v) => /^[0-9]{1,19}$/.test(v) && BigInt(v) <= maxFence, 'a next_cursor value from an earlier page').optional()
  .describe('The next_cursor of the previous page')

/** The filters `/audit` and `/audit/summary` share. */
const auditFilterShape = {
  tenant: tenantParam,
  entity: z.string().regex(new RegExp(`^[\\s\\S]{1,${maxEntityLength}}$`), `1-${maxEntityLength} characters`).optional().describe('Only rows about this entity'),
  code: z.string().regex(/^[a-z_]{1,64}$/, 'an error code such as stale_fence').optional().describe('Only rows with this problem code'),
  // An MCP rule's rows name its route and tool or method: `tickets-mcp/create_ticket` (src/config/mcp-schema.ts).
  route: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}(\/[A-Za-z0-9_][A-Za-z0-9_./:-]{0,127})?$/, 'a route name').optional().describe('Only rows for this route (an MCP rule\'s: route/tool)'),
  caller: z.string().regex(/^[\s\S]{1,256}$/, '1-256 characters').optional().describe('Only rows of this caller (the token\'s subject)'),
  trace_id: z.string().regex(/^[0-9a-f]{32}$/, 'a trace id: 32 lowercase hex digits').optional()
    .describe('Only rows of this trace: the W3C trace id of the request that caused them, as its SERVER span and log lines carry it'),
  since: windowBound('since'),
  until: windowBound('until'),
}

/** `/audit` query parameters: the schema the endpoint validates with and the OpenAPI document shows. */
export const auditQuerySchema = z.object({
  ...auditFilterShape,
  limit: limitParam,
  cursor: cursorParam,
  format: z.enum(['json', 'ndjson', 'csv']).optional()
    .describe('json (default): one page. ndjson or csv: every matching row (up to limit, when given), streamed; also chosen by Accept: application/x-ndjson or text/csv'),
}).strict()

/** `/audit/summary` query parameters: the audit filters and the bucket width. */
export const auditSummarySchema = z.object({
  ...auditFilterShape,
  bucket_ms: z.string().regex(/^[0-9]{1,9}$/, 'an integer from 1000 to 86400000')
    .refine((v) => Number(v) >= 1000 && Number(v) <= 86_400_000, 'an integer from 1000 to 86400000').optional()
    .describe('Bucket width in milliseconds, 1000 to 86400000 (default 60000)'),
}).strict()

/** `/entities/{entity}/history` and `/entities/{entity}/keys` query parameters. */
export const entityPageSchema = z.object({ tenant: tenantParam, limit: limitParam, before: cursorParam }).strict()

/** `?tenant=` on `/entities/{entity}` and `/idempotency/{key}`. */
export const tenantQuerySchema = z.object({ tenant: tenantParam }).strict()

export function parseTenantQuery(url: string): string | undefined {
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
  return { ...auditFilter(p), limit: p.limit === undefined ? 100 : Number(p.limit), before: p.cursor }
}

/** Validates `/audit/summary` query parameters; without `since` the window is the last hour. */
export function parseAuditSummaryQuery(params: URLSearchParams): { filter: AuditFilter; bucketMs: number } {
  const p = parseQuery(auditSummarySchema, params)
  const filter = auditFilter(p)
  if (filter.since === undefined && filter.sinceMs === undefined) filter.sinceMs = 3_600_000
  return { filter, bucketMs: p.bucket_ms === undefined ? 60_000 : Number(p.bucket_ms) }
}

function auditFilter(p: z.output<z.ZodObject<typeof auditFilterShape>>): AuditFilter {
  const filter: AuditFilter = { tenant: p.tenant, entity: p.entity, code: p.code, route: p.route, caller: p.caller, traceId: p.trace_id }
  for (const bound of ['since', 'until'] as const) {
    const value = p[bound]
    if (value === undefined) continue
    const ms = windowMs(value)
    if (ms === undefined) filter[bound] = value
    else if (bound === 'since') filter.sinceMs = ms
    else filter.untilMs = ms
  }
  return filter
}

/** One page of the audit trail: `next_cursor` is null on the last page. */
export interface AuditPage {
  items: AuditItem[]
  next_cursor: string | null
}

/**
 * One keyset page: `read` is asked for one row more than `limit`, which tells whether
 * another page exists; the cursor is the last item's (numeric) position.
 *
 * @example
 * const page = await keysetPage(100, (n) => store.listAudit({ ...query, limit: n }), (item) => item.id)
 */
export async function keysetPage<T>(limit: number, read: (limit: number) => Promise<T[]>, cursorOf: (item: T) => string): Promise<{ items: T[]; next_cursor: string | null }> {
  const rows = await read(limit + 1)
  const items = rows.slice(0, limit)
  return { items, next_cursor: rows.length > limit ? cursorOf(items.at(-1)!) : null }
}

/** Reads one page of the audit trail. */
export function readAuditPage(store: Store, query: AuditQuery): Promise<AuditPage> {
  return keysetPage(query.limit, (limit) => store.listAudit({ ...query, limit }), (item) => item.id)
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
