import { z } from 'zod'
import { duration, integer, port, size } from './fields.js'
import { checkRouteSet, entityRuleSchema, routeSchema } from './route-schema.js'
import { attestationSchema, authSchema, jobTypeSchema } from './sections.js'

// The sections live in their own modules; this one assembles the file's shape and is where
// callers import the configuration from.
export { checkRouteSet, entityRuleSchema, idempotencyWaitOf, routeSchema, type EntityRuleConfig, type RouteConfig } from './route-schema.js'
export { mcpRuleConfig, mcpRuleSchema, type McpRuleConfig } from './mcp-schema.js'
export { attestationSchema, authSchema, jobTypeSchema, type AttestationConfig, type AuthConfig, type JobType } from './sections.js'

/** `store.max_connections` when not given. */
export const defaultMaxConnections = 20

const loopback = new Set(['127.0.0.1', '::1', 'localhost'])

// At least an hour: a retention is a policy in days, and a typo such as `90` (90 ms) must not empty a table.
const retention = duration.pipe(z.number().min(3_600_000, 'expected a retention of at least 1h, such as 90d'))

/** `audit.retention`, `fence_history.retention`: rows older than this are purged; absent keeps them forever. */
const retentionSection = (what: string) => z.object({
  retention: retention.optional().describe(`How long ${what} are kept (e.g. 90d); absent: forever`),
}).strict().prefault({})

/** The bounds of `server` that only make sense together; each problem names its field. */
function checkServerLimits(s: { headers_timeout: number; request_timeout: number; lingering_time: number; max_connections: number; max_connections_per_peer: number }, ctx: z.RefinementCtx): void {
  // Node refuses a header timeout longer than the request's: the headers are part of the request.
  if (s.headers_timeout > s.request_timeout) ctx.addIssue({ code: 'custom', path: ['headers_timeout'], message: 'must be at most server.request_timeout' })
  // The body refused with a 413 is read and discarded for up to lingering_time within the same request.
  if (s.request_timeout < s.lingering_time) ctx.addIssue({ code: 'custom', path: ['request_timeout'], message: 'must be at least server.lingering_time, or a refused body\'s linger is cut off' })
  if (s.max_connections_per_peer > s.max_connections) ctx.addIssue({ code: 'custom', path: ['max_connections_per_peer'], message: 'must be at most server.max_connections' })
}

export const configSchema = z.object({
  server: z.object({
    host: z.string().min(1).default('127.0.0.1'),
    port: port.default(8080),
    admin_host: z.string().min(1).default('127.0.0.1'),
    admin_port: port.default(8081),
    max_request_body: size.default(1024 * 1024),
    max_header_bytes: size.default(16 * 1024),
    // After a 413, the rest of the body is read and discarded for at most this long in all, and
    // this long without a byte, so the client reads its answer (src/runtime/node/linger.ts).
    lingering_time: duration.pipe(z.number().min(1, 'must be positive').max(600_000, 'must be at most 10m')).default(30_000),
    lingering_timeout: duration.pipe(z.number().min(1, 'must be positive').max(60_000, 'must be at most 60s')).default(5_000),
    // Worker processes on the same ports (src/runtime/node/supervisor.ts); `auto`: the CPUs this process may use.
    workers: z.union([integer(1, 256), z.literal('auto')]).default(1),
    // Without auth, the host names (besides loopback and the listen address) requests may name (src/http/browser-guard.ts).
    allowed_hosts: z.array(z.string().regex(/^[A-Za-z0-9.:-]+$/, 'expected a host name or address, without a port')).default([]),
    // Bounds on each plane's connections (src/runtime/node/server.ts): a client that sends its
    // headers, or its request, a byte at a time is cut off; no client holds every connection.
    headers_timeout: duration.pipe(z.number().min(100, 'must be at least 100ms').max(600_000, 'must be at most 10m')).default(10_000),
    request_timeout: duration.pipe(z.number().min(100, 'must be at least 100ms').max(3_600_000, 'must be at most 1h')).default(60_000),
    max_connections: integer(1, 1_000_000).default(1024),
    max_connections_per_peer: integer(1, 1_000_000).default(256),
    // After SIGTERM, how long /readyz fails while both planes keep serving, before the drain
    // stops accepting: the time load balancers take to stop sending (docs/deployment.md).
    drain_delay: duration.pipe(z.number().max(300_000, 'must be at most 5m')).default(5_000),
  }).strict().superRefine(checkServerLimits).prefault({}),
  auth: authSchema.prefault({}),
  store: z.object({
    url: z.string().optional().transform((u) => (u === '' ? undefined : u)).pipe(
      z.string().regex(/^postgres(ql)?:\/\//, 'expected a postgres:// URL').optional(),
    ),
    // A direct (or session-mode) connection for LISTEN only, beside a store.url through a
    // transaction pooler that cannot carry one: rule changes and job wake-ups then arrive by
    // notification (docs/deployment.md#pgbouncer). Checked by connecting at start.
    listen_url: z.string().optional().transform((u) => (u === '' ? undefined : u)).pipe(
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
    // Refuse commands while no synchronous standby confirms commits (docs/operations.md#failover).
    require_replicated: z.boolean().default(false),
    // How often expired keys, and audit rows and fence history past their retention, are deleted.
    purge_interval: duration.pipe(z.number().min(1000, 'must be at least 1s').max(3_600_000, 'must be at most 1h')).default(60_000),
  }).strict().prefault({}),
  log: z.object({
    level: z.enum(['debug', 'info', 'warn', 'error', 'silent']).default('info'),
  }).strict().prefault({}),
  // What spans may carry beyond identifiers of fencegate's own; the exporter is configured by OTEL_* (docs/operations.md#traces).
  telemetry: z.object({
    entity: z.boolean().default(true),
  }).strict().prefault({}),
  routes: z.array(routeSchema).min(1, 'at least one route is required'),
  entity_rules: z.array(entityRuleSchema).default([]),
  job_types: z.array(jobTypeSchema).default([]),
  // How long finished jobs (and their output) are kept before the gateway deletes them.
  job_retention: duration.pipe(z.number().min(3_600_000, 'must be at least 1h').max(3650 * 86_400_000, 'must be at most 3650d')).default(7 * 86_400_000),
  // Claims with `wait` one tenant may hold open in one gateway process; one more is 429 too_many_waiting_claims.
  job_waiting_claims: integer(1, 100_000).default(100),
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

/** The validated configuration. */
export type Config = z.output<typeof configSchema>

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
