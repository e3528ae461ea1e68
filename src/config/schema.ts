import { z } from 'zod'
import { parseDuration, parseSize } from './units.js'
import { compileEntityTemplate, compilePathPattern, isStorableText, maxEntityLength, reservedPrefix } from './templates.js'

// Integers may come from `${VAR}` expansion, which always yields a string.
const integer = (min: number, max: number, what = 'an integer') => z.union([z.number(), z.string().regex(/^\d+$/, `expected ${what}`)])
  .transform(Number)
  .pipe(z.number().int().min(min).max(max))
const port = integer(0, 65535, 'a port number')

/** `store.max_connections` when not given. */
export const defaultMaxConnections = 20

const size = z.union([z.number(), z.string()]).transform((v, ctx) => {
  const bytes = parseSize(v)
  if (bytes === undefined || bytes < 1) {
    ctx.addIssue({ code: 'custom', message: `expected a size such as 1MiB or 65536, got ${JSON.stringify(v)}` })
    return z.NEVER
  }
  return bytes
})

const duration = z.union([z.number(), z.string()]).transform((v, ctx) => {
  const ms = parseDuration(v)
  if (ms === undefined) {
    ctx.addIssue({ code: 'custom', message: `expected a duration such as 30s, 24h or 500ms, got ${JSON.stringify(v)}` })
    return z.NEVER
  }
  return ms
})

const upstream = z.string().transform((v, ctx) => {
  let url: URL
  try {
    url = new URL(v)
  } catch {
    ctx.addIssue({ code: 'custom', message: `expected an http(s) URL, got ${JSON.stringify(v)}` })
    return z.NEVER
  }
  if (!['http:', 'https:'].includes(url.protocol) || url.username || url.password || url.search || url.hash) {
    ctx.addIssue({ code: 'custom', message: 'expected an http(s) URL without credentials, query or fragment' })
    return z.NEVER
  }
  return { origin: url.origin, basePath: url.pathname.replace(/\/+$/, '') }
})

const headerName = /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/
// Framing, cookies and what only the gateway sets on a replay never come from the store.
const unreplayable = new Set(['connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'proxy-connection', 'te', 'trailer',
  'transfer-encoding', 'upgrade', 'host', 'content-length', 'set-cookie', 'set-cookie2', 'idempotent-replayed', 'x-request-id', 'idempotency-key'])

// Routes and entity rules share one namespace (the rules API addresses both by name).
const ruleName = z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/, 'expected 1-64 letters, digits, _ . -')

export const routeSchema = z.object({
  name: ruleName,
  method: z.string().transform((m) => m.toUpperCase()).pipe(z.enum(['GET', 'POST', 'PUT', 'PATCH', 'DELETE'])),
  path: z.string().superRefine((p, ctx) => {
    if (p === reservedPrefix.slice(0, -1) || p.startsWith(reservedPrefix)) ctx.addIssue({ code: 'custom', message: `${reservedPrefix} is reserved for fencegate itself` })
    try {
      compilePathPattern(p)
    } catch (e) {
      ctx.addIssue({ code: 'custom', message: (e as Error).message })
    }
  }),
  upstream,
  entity: z.string().optional().superRefine((t, ctx) => {
    if (t === undefined) return
    try {
      compileEntityTemplate(t)
    } catch (e) {
      ctx.addIssue({ code: 'custom', message: (e as Error).message })
    }
  }),
  fence: z.enum(['required', 'optional', 'off', 'lease']).default('required'),
  timeout_ms: integer(1, 600_000).default(10_000),
  idempotency: z.enum(['required', 'optional', 'off']).default('off'),
  idempotency_ttl: duration.pipe(z.number().min(1000, 'must be at least 1s').max(365 * 86_400_000, 'must be at most 365d')).default(86_400_000),
  idempotency_lock: duration.pipe(z.number().min(1, 'must be positive').max(86_400_000, 'must be at most 24h')).default(30_000),
  // Default: the route's timeout_ms (idempotencyWaitOf), so a duplicate outlasts its original and gets the one result.
  idempotency_wait: duration.pipe(z.number().max(60_000, 'must be at most 60s')).optional(),
  on_unknown_outcome: z.enum(['fail', 'retry']).default('fail'),
  /** The upstream de-duplicates Idempotency-Key itself (Stripe does): an unknown outcome is retried with the same key. */
  upstream_dedupes_keys: z.boolean().default(false),
  /** A vendor header that states whether a refusal is worth retrying (`true`/`false`), e.g. Stripe-Should-Retry. */
  retry_hint_header: z.string().regex(headerName, 'expected a header name').optional(),
  /** Upstream response headers stored and replayed beside the built-in allow-list, e.g. Request-Id. */
  replay_headers: z.array(z.string().regex(headerName, 'expected a header name').transform((h) => h.toLowerCase())
    .refine((h) => !unreplayable.has(h), 'this header is never replayed (hop-by-hop, Set-Cookie or fencegate\'s own)')).default([]),
  transient_statuses: z.array(z.number().int().min(100).max(599)).default([429, 503]),
  max_stored_body: size.default(1024 * 1024),
  scopes: z.array(z.string().regex(/^[\x21-\x7E]{1,128}$/, 'expected a scope such as payments:write')).default([]),
  claimed_tenant: z.string().regex(/^(body(\.[^.\s]+)+|header\.[A-Za-z0-9-]+)$/, 'expected body.a.b or header.Name').optional(),
  forward_authorization: z.boolean().default(false),
  ordering: z.enum(['none', 'serialize']).default('none'),
  ordering_wait: duration.pipe(z.number().max(60_000, 'must be at most 60s')).default(5000),
  upstream_headers: z.record(z.string().regex(headerName, 'expected a header name'), z.string().regex(/^[\t\x20-\x7E\x80-\xFF]*$/, 'expected a header value without control characters')).default({}),
  /** Sign a Fence-Attestation for the upstream (src/attest.ts); needs the gateway's `attestation` section. */
  attest: z.boolean().default(false),
}).strict().superRefine((r, ctx) => {
  // An attestation says a fence check passed; on a route that checks none it would say nothing.
  if (r.attest && r.fence === 'off') ctx.addIssue({ code: 'custom', path: ['attest'], message: 'attest needs a fence check: set fence to required, optional or lease' })
  if (r.idempotency !== 'off' && r.idempotency_lock <= r.timeout_ms) {
    ctx.addIssue({ code: 'custom', path: ['idempotency_lock'], message: `must exceed timeout_ms (${r.timeout_ms} ms): a lock that ends before the upstream answers would hand the key to a duplicate` })
  }
  if (r.fence === 'lease' && (r.entity === undefined || !/^job:\{[^{}]+\}$/.test(r.entity))) {
    ctx.addIssue({ code: 'custom', path: ['entity'], message: 'fence: lease needs an entity of the form job:{source.name}, e.g. job:{header.X-Job-Id}' })
  }
  if (r.fence !== 'off' && r.entity === undefined) {
    ctx.addIssue({ code: 'custom', path: ['entity'], message: `required when fence is ${r.fence}` })
  }
  // Only the cross-field check is left once path and entity compiled on their own.
  let pattern, entity
  try {
    pattern = compilePathPattern(r.path)
    entity = r.entity === undefined ? undefined : compileEntityTemplate(r.entity)
  } catch {
    return
  }
  const missing = entity?.params.find((p) => !pattern.params.includes(p))
  if (missing) ctx.addIssue({ code: 'custom', path: ['entity'], message: `uses params.${missing}, which ${r.path} does not define` })
})

/**
 * How long a duplicate waits for its in-flight original: the route's
 * `idempotency_wait`, else its `timeout_ms` (at most 60 s), so that it outlasts
 * the original. Resolved here rather than stored, so a rule records what was written.
 *
 * @example idempotencyWaitOf(parseConfig(file).routes[0]) // 10000 with the defaults
 */
export function idempotencyWaitOf(route: Pick<RouteConfig, 'idempotency_wait' | 'timeout_ms'>): number {
  return route.idempotency_wait ?? Math.min(route.timeout_ms, 60_000)
}

/**
 * An entity rule: overrides for every entity matching `entity_match`, where `*`
 * stands for any run of characters (`invoice:*`, `invoice:42`).
 */
export const entityRuleSchema = z.object({
  name: ruleName,
  entity_match: z.string().min(1).max(maxEntityLength).refine(isStorableText, 'expected text without control characters'),
  /** Only this tenant's entities; every tenant's when absent. */
  tenant: z.string().min(1).max(128).optional(),
  fence: z.enum(['required', 'optional', 'off']).optional(),
  frozen: z.boolean().default(false),
  ordering: z.enum(['none', 'serialize']).optional(),
}).strict().superRefine((r, ctx) => {
  if (!r.frozen && r.fence === undefined && r.ordering === undefined) {
    ctx.addIssue({ code: 'custom', message: 'an entity rule must set frozen, fence or ordering' })
  }
})

const jwsAlgorithms = ['ES256', 'ES384', 'ES512', 'RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'EdDSA'] as const

export const authSchema = z.object({
  mode: z.enum(['none', 'jwt']).default('none'),
  issuer: z.string().min(1).optional(),
  audience: z.string().min(1).optional(),
  jwks_url: z.url({ protocol: /^https?$/ }).optional(),
  public_keys: z.array(z.object({ file: z.string().min(1), alg: z.enum(jwsAlgorithms) }).strict()).min(1).optional(),
  hs256_secret: z.string().optional(),
  tenant_claim: z.string().min(1).default('tenant_id'),
  clock_tolerance: duration.pipe(z.number().max(300_000, 'must be at most 5m')).default(5000),
}).strict().superRefine((a, ctx) => {
  if (a.mode !== 'jwt') return
  const sources = [a.jwks_url, a.public_keys, a.hs256_secret].filter((s) => s !== undefined).length
  if (sources !== 1) ctx.addIssue({ code: 'custom', message: 'jwt needs exactly one of jwks_url, public_keys or hs256_secret' })
  if (!a.issuer) ctx.addIssue({ code: 'custom', path: ['issuer'], message: 'required when mode is jwt' })
  if (!a.audience) ctx.addIssue({ code: 'custom', path: ['audience'], message: 'required when mode is jwt' })
  // HS256 with a short secret can be brute-forced offline from any token.
  if (a.hs256_secret !== undefined && new TextEncoder().encode(a.hs256_secret).byteLength < 32) {
    ctx.addIssue({ code: 'custom', path: ['hs256_secret'], message: 'must be at least 32 bytes' })
  }
})

/** The key that signs Fence-Attestation headers (docs/attestation.md); the file is read by the runtime's entry. */
export const attestationSchema = z.object({
  key_file: z.string().min(1),
  alg: z.enum(['ES256', 'EdDSA']),
  kid: z.string().regex(/^[\x21-\x7E]{1,128}$/, 'expected 1-128 visible ASCII characters'),
  // Short: an attestation is checked on arrival, and a leaked one must not stay usable for long.
  ttl: duration.pipe(z.number().min(1000, 'must be at least 1s').max(600_000, 'must be at most 10m')).default(60_000),
  issuer: z.string().min(1).max(256).default('fencegate'),
}).strict()

export const jobTypeSchema = z.object({
  name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$/, 'expected 1-64 letters, digits, _ . : -'),
  lease: duration.pipe(z.number().min(1000, 'must be at least 1s').max(86_400_000, 'must be at most 24h')),
  max_attempts: integer(1, 1000).default(5),
  backoff: duration.pipe(z.number().max(600_000, 'must be at most 10m')).default(10_000),
  max_runtime: duration.pipe(z.number().min(1000).max(7 * 86_400_000, 'must be at most 7d')).default(1_800_000),
}).strict().superRefine((j, ctx) => {
  if (j.max_runtime < j.lease) ctx.addIssue({ code: 'custom', path: ['max_runtime'], message: 'must be at least the lease' })
})

const loopback = new Set(['127.0.0.1', '::1', 'localhost'])

// At least an hour: a retention is a policy in days, and a typo such as `90` (90 ms) must not empty a table.
const retention = duration.pipe(z.number().min(3_600_000, 'expected a retention of at least 1h, such as 90d'))

/** `audit.retention`, `fence_history.retention`: rows older than this are purged; absent keeps them forever. */
const retentionSection = (what: string) => z.object({
  retention: retention.optional().describe(`How long ${what} are kept (e.g. 90d); absent: forever`),
}).strict().prefault({})

export const configSchema = z.object({
  server: z.object({
    host: z.string().min(1).default('127.0.0.1'),
    port: port.default(8080),
    admin_host: z.string().min(1).default('127.0.0.1'),
    admin_port: port.default(8081),
    max_request_body: size.default(1024 * 1024),
    max_header_bytes: size.default(16 * 1024),
  }).strict().prefault({}),
  auth: authSchema.prefault({}),
  store: z.object({
    url: z.string().optional().transform((u) => (u === '' ? undefined : u)).pipe(
      z.string().regex(/^postgres(ql)?:\/\//, 'expected a postgres:// URL').optional(),
    ),
    data_dir: z.string().min(1).default('.fencegate'),
    // Bounds every refusal while PostgreSQL is unreachable (docs/operations.md).
    connect_timeout: duration.pipe(z.number().min(100, 'must be at least 100ms').max(60_000, 'must be at most 60s')).default(1000),
    // `transaction` behind a pooler in transaction mode (PgBouncer): each statement may run on
    // another server connection, so none may rely on a prepared statement or a pipeline.
    pooler: z.enum(['none', 'transaction']).default('none'),
    // Connections to PostgreSQL. When all are busy, postgres.js pipelines statements on them,
    // which costs both sides less CPU than a connection per statement (docs/benchmarks.md).
    max_connections: integer(1, 100).default(defaultMaxConnections),
  }).strict().prefault({}),
  log: z.object({
    level: z.enum(['debug', 'info', 'warn', 'error', 'silent']).default('info'),
  }).strict().prefault({}),
  routes: z.array(routeSchema).min(1, 'at least one route is required'),
  entity_rules: z.array(entityRuleSchema).default([]),
  job_types: z.array(jobTypeSchema).default([]),
  // How long finished jobs (and their output) are kept before the gateway deletes them.
  job_retention: duration.pipe(z.number().min(3_600_000, 'must be at least 1h').max(3650 * 86_400_000, 'must be at most 3650d')).default(7 * 86_400_000),
  attestation: attestationSchema.optional(),
  audit: retentionSection('audit rows'),
  fence_history: retentionSection('fence history rows'),
}).strict().superRefine((c, ctx) => {
  const jobTypes = new Set<string>()
  c.job_types.forEach((j, i) => {
    if (jobTypes.has(j.name)) ctx.addIssue({ code: 'custom', path: ['job_types', i, 'name'], message: `duplicate job type ${j.name}` })
    jobTypes.add(j.name)
  })
  if (c.auth.mode === 'none' && !loopback.has(c.server.admin_host)) {
    ctx.addIssue({ code: 'custom', path: ['server', 'admin_host'], message: 'without auth the admin plane may only listen on loopback (127.0.0.1, ::1 or localhost)' })
  }
  checkRouteSet(c.routes, c.auth.mode, ctx, c.attestation !== undefined)
  const names = new Set(c.routes.map((r) => r.name))
  c.entity_rules.forEach((r, i) => {
    if (names.has(r.name)) ctx.addIssue({ code: 'custom', path: ['entity_rules', i, 'name'], message: `duplicate rule name ${r.name}` })
    names.add(r.name)
  })
})

/**
 * The checks across routes, shared by the config file and the rules API:
 * unique names, no two routes matching one request, scopes and claimed
 * tenants only with authentication, `attest` only with a signing key.
 */
export function checkRouteSet(routes: RouteConfig[], authMode: 'none' | 'jwt', ctx: z.RefinementCtx, canAttest: boolean): void {
  const names = new Set<string>()
  const shapes = new Set<string>()
  routes.forEach((r, i) => {
    if (authMode === 'none' && r.scopes.length > 0) ctx.addIssue({ code: 'custom', path: ['routes', i, 'scopes'], message: 'scopes need auth.mode: jwt' })
    if (authMode === 'none' && r.claimed_tenant) ctx.addIssue({ code: 'custom', path: ['routes', i, 'claimed_tenant'], message: 'claimed_tenant needs auth.mode: jwt' })
    if (r.attest && !canAttest) ctx.addIssue({ code: 'custom', path: ['routes', i, 'attest'], message: "attest needs the gateway's attestation section (its signing key)" })
    if (names.has(r.name)) ctx.addIssue({ code: 'custom', path: ['routes', i, 'name'], message: `duplicate route name ${r.name}` })
    names.add(r.name)
    const shape = `${r.method} ${r.path.replace(/:[^/]+/g, ':')}`
    if (shapes.has(shape)) ctx.addIssue({ code: 'custom', path: ['routes', i, 'path'], message: `another route already matches ${r.method} ${r.path}` })
    shapes.add(shape)
  })
}

/** The validated configuration. */
export type Config = z.output<typeof configSchema>
/** The validated `auth` section. */
export type AuthConfig = z.output<typeof authSchema>
/** The validated `attestation` section. */
export type AttestationConfig = z.output<typeof attestationSchema>
/** One validated job type. */
export type JobType = z.output<typeof jobTypeSchema>
/** One validated entity rule. */
export type EntityRuleConfig = z.output<typeof entityRuleSchema>
/** One validated route. */
export type RouteConfig = z.output<typeof routeSchema>

/** A configuration error that names every bad field. */
export class ConfigError extends Error {
  override name = 'ConfigError'
  constructor(readonly problems: string[]) {
    super(`invalid configuration:\n  ${problems.join('\n  ')}`)
  }
}

function formatPath(path: PropertyKey[]): string {
  return path.reduce<string>((acc, p) => (typeof p === 'number' ? `${acc}[${p}]` : acc ? `${acc}.${String(p)}` : String(p)), '') || '(root)'
}

/**
 * Validates a parsed configuration object, throwing a ConfigError that names each bad field.
 *
 * @example
 * const config = parseConfig({ routes: [{ name: 'r', method: 'POST', path: '/x/:id', upstream: 'http://127.0.0.1:9001', entity: 'x:{params.id}' }] })
 */
export function parseConfig(input: unknown): Config {
  const result = configSchema.safeParse(input ?? {})
  if (!result.success) throw new ConfigError(result.error.issues.map((i) => `${formatPath(i.path)}: ${i.message}`))
  return result.data
}
