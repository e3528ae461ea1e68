import { Hono } from 'hono'
import { routePath } from 'hono/route'
import { requestIdOf } from '../gateway/app.js'
import { noAuthentication, type Authenticate } from '../http/identity.js'
import { noMetrics, type Metrics, type MetricsExposition } from '../observe/metrics.js'
import { noTracing, type Tracing } from '../observe/tracing.js'
import { endAdminSpan, startAdminSpan } from '../gateway/spans.js'
import { adminOpenApi } from './openapi.js'
import { FencegateError, problemResponse } from '../http/problems.js'
import type { Store } from '../store/store.js'
import { createRulesApp } from '../rules/api.js'
import { createConsoleApp } from './ui.js'
import type { RuleRegistry } from '../rules/registry.js'
import type { Db } from '../store/db.js'
import { localDurability, type Durability } from '../store/durability.js'
import { browserRefusal, type BrowserGuard } from '../http/browser-guard.js'
import { createAdminJobsApp } from './jobs.js'
import { createEntitiesApp } from './entities.js'
import { createHistoryApp } from './history.js'
import { createKeysApp } from './keys.js'
import { auditFormat, exportAudit, type AuditFormat } from './audit-export.js'
import { parseAuditQuery, readAuditPage, storeCall, tenantFor, type AdminEnv } from './query.js'
import { probePaths, routeProbes, type ReadinessChecks } from './probes.js'

export { auditQuerySchema, bumpRequestSchema, parseAuditQuery, parseBump, readAuditPage, tenantQuerySchema, type AuditPage } from './query.js'

export interface AdminDeps {
  store: Store
  /** Without auth, keeps web pages out (src/http/browser-guard.ts), the console's own page included in what it lets through. */
  browserGuard?: BrowserGuard
  /** With `server.workers > 1`, how many workers are live (reported by /health). */
  workers?: () => number
  /** What /health reports of the store's durability; defaults to `local`. */
  durability?: Pick<Durability, 'status'>
  /** Defaults to no authentication, for an admin plane bound to loopback. */
  authenticate?: Authenticate
  /** Counts admin requests; defaults to recording nothing. */
  metrics?: Metrics
  /** What `GET /metrics` serves; without it the endpoint does not exist (404). */
  exposition?: MetricsExposition
  /** Rules kept in the database; without them `/rules` does not exist (404). */
  rules?: { registry: RuleRegistry; db: Db }
  /** The database the read-only job views read; without it `/jobs` does not exist (404). */
  db?: Db
  /** A SERVER span per request (src/observe/tracing.ts); defaults to none. Node passes the data plane's. */
  tracing?: Tracing
  /** What `GET /readyz` checks (src/admin/probes.ts); without it `/readyz` does not exist (404). `/livez` always does. */
  readiness?: ReadinessChecks
}

/**
 * Builds the admin-plane Hono app: health, the audit trail, entity state,
 * idempotency records, metrics and its own OpenAPI description.
 * With `auth.mode: jwt` every endpoint but /health, /livez and /readyz needs a token (and all but
 * /openapi.json an admin scope); without auth the configuration only lets it listen on loopback.
 *
 * @example
 * const admin = createAdminApp({ store })
 * const page = await (await admin.request('/audit?code=stale_fence&limit=50')).json()
 */
export function createAdminApp(deps: AdminDeps): Hono<AdminEnv> {
  const { store } = deps
  const app = new Hono<AdminEnv>()
  // Outermost, so it also sees answers made by onError (a refused token, an unknown endpoint).
  observeRequests(app, deps.tracing ?? noTracing, deps.metrics ?? noMetrics)
  // Before everything, the console too: a DNS-rebound page must not even load it as its own.
  if (deps.browserGuard) guardBrowsers(app, deps.browserGuard)
  // The console's static files hold no tenant data: served before authentication, so the page can ask for a token.
  app.route('/ui', createConsoleApp())
  identifyRequests(app, deps.authenticate ?? noAuthentication)
  routeOwnEndpoints(app, deps)
  routeProbes(app, deps.readiness)
  app.route('/', createEntitiesApp(store))
  app.route('/', createKeysApp(store))
  if (deps.rules) app.route('/rules', createRulesApp(deps.rules))
  app.route('/', createHistoryApp(store))
  if (deps.db) app.route('/jobs', createAdminJobsApp(deps.db))
  answerProblems(app)
  return app
}

/** A span and a metric per admin request, the unmatched ones included. */
function observeRequests(app: Hono<AdminEnv>, tracing: Tracing, metrics: Metrics): void {
  app.use(async (c, next) => {
    // Not the path as sent: it may hold an idempotency key or an entity (endAdminSpan sets the template).
    const span = startAdminSpan(tracing, { method: c.req.method, url: new URL(c.req.url), headers: c.req.raw.headers })
    c.set('span', span)
    await next()
    const endpoint = routePath(c, -1)
    metrics.adminRequest({ endpoint: endpoint === '/*' ? 'unmatched' : endpoint, status: c.res.status })
    if (span.sampled) endAdminSpan(span, c.req.method, endpoint === '/*' ? undefined : endpoint, c.res.status, c.get('refusal'))
    else span.end()
  })
}

function guardBrowsers(app: Hono<AdminEnv>, guard: BrowserGuard): void {
  app.use(async (c, next) => {
    const refusal = browserRefusal(c.req.raw.headers, c.req.method, guard, true)
    if (refusal) return problemResponse(refusal, requestIdOf(c.req.raw), { accept: c.req.header('accept') })
    await next()
    return undefined
  })
}

function identifyRequests(app: Hono<AdminEnv>, authenticate: Authenticate): void {
  app.use(async (c, next) => {
    c.set('requestId', requestIdOf(c.req.raw))
    // Health and the probes are for load balancers and kubelets and carry no tenant data; everything else needs an identity.
    if (!probePaths.has(c.req.path)) c.set('identity', await authenticate(c.req.raw))
    await next()
    c.header('x-request-id', c.get('requestId'))
  })
}

/** The admin plane's own endpoints: health, the audit trail, metrics and the OpenAPI description. */
function routeOwnEndpoints(app: Hono<AdminEnv>, deps: AdminDeps): void {
  const { store, exposition } = deps
  // A gateway that refuses every command (its store cannot prove its record) is unavailable too.
  app.get('/health', async (c) => {
    const { level, refusing } = (deps.durability ?? localDurability).status()
    const workers = deps.workers ? { workers: deps.workers() } : {}
    try {
      await store.ping()
    } catch {
      return c.json({ status: 'unavailable', store: 'down', durability: level, ...workers }, 503)
    }
    if (refusing) return c.json({ status: 'unavailable', store: 'up', durability: level, refusing, ...workers }, 503)
    return c.json({ status: 'ok', store: 'up', durability: level, ...workers })
  })

  app.get('/audit', async (c) => {
    const params = new URL(c.req.url).searchParams
    const query = parseAuditQuery(params)
    query.tenant = tenantFor(c.get('identity'), query.tenant, true)
    const format = auditFormat(params.get('format') as AuditFormat | null ?? undefined, c.req.header('accept'))
    if (format !== 'json') return exportAudit(store, query, format, params.has('limit') ? query.limit : undefined)
    return c.json(await storeCall(() => readAuditPage(store, query)))
  })

  app.get('/metrics', async (c) => {
    if (!exposition) throw new FencegateError('not_found', 'no such admin endpoint')
    tenantFor(c.get('identity'), undefined, false)
    return c.body(await exposition.render(), 200, { 'content-type': exposition.contentType })
  })

  app.get('/openapi.json', (c) => c.json(adminOpenApi()))
}

/** Every failure, an unknown endpoint included, answers as a problem. */
function answerProblems(app: Hono<AdminEnv>): void {
  app.notFound(() => {
    throw new FencegateError('not_found', 'no such admin endpoint')
  })
  app.onError((err, c) => {
    const problem = err instanceof FencegateError ? err : new FencegateError('internal_error')
    // The span's decision: the outermost middleware ends the span once this answer is made.
    c.set('refusal', problem.code)
    return problemResponse(problem, c.get('requestId'), { accept: c.req.header('accept') })
  })
}
