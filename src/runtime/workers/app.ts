import { createAdminApp } from '../../admin/app.js'
import type { AttestationSigner } from '../../gateway/attest.js'
import { createApp, requestIdOf } from '../../gateway/app.js'
import { failureProblem } from '../../gateway/pipeline.js'
import { ConfigError, type Config } from '../../config/schema.js'
import { createAuthenticator, type Authenticate } from '../../http/identity.js'
import { createJobStore } from '../../leases/store.js'
import { createLogger, type Logger } from '../../observe/log.js'
import { FencegateError, problemResponse } from '../../http/problems.js'
import { unsafeTarget } from '../../http/target.js'
import { StoreError } from '../../store/db.js'
import { createStore } from '../../store/store.js'
import { configFromText, databaseUrlOf, stringBindings, workerAttestationSigner, workerKeys, type WorkerContext, type WorkerEnv } from './bindings.js'
import { connectWorkersPostgres } from './db.js'
import { createFetchForward } from './forward.js'
import { createWorkerRules, defaultRulesCheckMs, type WorkerRules } from './rules.js'
import { openRequestScope, whenConsumed, type RequestScope } from './scope.js'

export interface FencegateWorker {
  fetch(request: Request, ctx: WorkerContext): Promise<Response>
  /** Deletes up to `limit` expired idempotency records; the Node gateway does this every minute. */
  purgeExpired(limit?: number): Promise<number>
  /** Resolves once every request's store has closed (the Worker itself holds no connection). */
  close(): Promise<void>
}

/** Where the admin plane is served when FENCEGATE_ADMIN=on. */
export const adminPrefix = '/_admin/'

/**
 * Builds fencegate for one Workers isolate: the configuration, authenticator
 * and forward are built here once; the store is opened per request, because
 * Workers forbids a socket opened in one request from serving another.
 * Migrations are not run: run `fencegate migrate` against the database first.
 *
 * @example
 * const worker = await createWorker(env)
 * const res = await worker.fetch(request, ctx)
 */
export async function createWorker(env: WorkerEnv): Promise<FencegateWorker> {
  const { vars, config, databaseUrl, adminOn } = workerSettings(env)
  const log = createLogger(config.log.level)
  const authenticate = await createAuthenticator(config.auth, workerKeys(config.auth, vars))
  const attest = await workerAttestationSigner(config, vars)
  const forward = createFetchForward()
  const rules = createWorkerRules({ config, log, checkEveryMs: rulesCheckMs(vars) })
  const closing = new Set<Promise<void>>()

  return {
    async fetch(request, ctx) {
      const unsafe = refusedTarget(request)
      if (unsafe) return unsafe
      const scope = openRequestScope(databaseUrl, forward)
      let response: Response
      try {
        response = await route(request, scope, { config, authenticate, log, adminOn, attest, rules })
      } catch (err) {
        // The apps render their own errors; this is only reached by a failure in the wiring itself.
        response = problemResponse(new FencegateError('internal_error'), crypto.randomUUID())
        log.error('internal_error', { error: (err as Error)?.name ?? typeof err })
      }
      const { body, done } = whenConsumed(response.body)
      const closed = scope.closeAfter(done)
      closing.add(closed)
      void closed.finally(() => closing.delete(closed))
      ctx.waitUntil(closed)
      return new Response(body, response)
    },
    async purgeExpired(limit = 1000) {
      const store = createStore(connectWorkersPostgres(databaseUrl))
      try {
        return await store.purgeExpired(limit)
      } finally {
        await store.close().catch(() => {})
      }
    },
    async close() {
      await Promise.all(closing)
    },
  }
}

/** The configuration and the Worker's own variables, refusing what a Worker cannot honour. */
function workerSettings(env: WorkerEnv): { vars: Record<string, string>; config: Config; databaseUrl: string; adminOn: boolean } {
  const vars = stringBindings(env)
  if (!vars.FENCEGATE_CONFIG) throw new ConfigError(['FENCEGATE_CONFIG: not set (the configuration as YAML or JSON text)'])
  const config = configFromText(vars.FENCEGATE_CONFIG, vars)
  const databaseUrl = databaseUrlOf(env, config, vars)
  const adminOn = vars.FENCEGATE_ADMIN === 'on'
  refuseUnsupported(config, adminOn)
  return { vars, config, databaseUrl, adminOn }
}

/** Settings a Worker cannot honour are refused at start, never ignored. */
function refuseUnsupported(config: Config, adminOn: boolean): void {
  // The Node admin plane without auth is confined to loopback; a Worker has no loopback.
  if (adminOn && config.auth.mode === 'none') throw new ConfigError(['FENCEGATE_ADMIN: the admin plane needs auth.mode: jwt on Workers'])
  if (adminOn) {
    const shadowed = config.routes.find((r) => r.path === adminPrefix.slice(0, -1) || r.path.startsWith(adminPrefix))
    if (shadowed) throw new ConfigError([`routes: ${shadowed.name} is under ${adminPrefix}, which FENCEGATE_ADMIN=on serves`])
  }

  // A Worker's fetch takes no CA or client certificate per request: refused, never ignored.
  const tlsRoute = config.routes.findIndex((r) => r.upstream_tls)
  if (tlsRoute >= 0) {
    throw new ConfigError([`routes[${tlsRoute}].upstream_tls: not supported on Workers (fetch trusts the platform's CAs and sends no client certificate); use Cloudflare's mTLS certificate binding in front of the upstream, or the Node gateway`])
  }

  // The durability checks live in a long-lived process: they need a reading of the store's
  // replication and the position of the last acknowledged write, which no isolate keeps.
  if (config.store.require_replicated) {
    throw new ConfigError(['store.require_replicated: not supported on Workers (a Worker keeps no reading of the store\'s replication between requests); make the database refuse to acknowledge unreplicated commits instead (synchronous_commit with a synchronous standby, docs/operations.md#failover), or use the Node gateway'])
  }
}

/**
 * The raw-target guard Node applies (src/http/target.ts), on both planes and before a store is
 * opened. The URL parser has already resolved dot segments (`/a/../b` arrives as `/b`, which
 * is the path matched and forwarded), but it keeps `;` parameters and encodings that Tomcat
 * or Spring would resolve into another path than the one the gateway fences.
 */
function refusedTarget(request: Request): Response | undefined {
  const url = new URL(request.url)
  const unsafe = unsafeTarget(url.pathname + url.search)
  return unsafe && problemResponse(unsafe, requestIdOf(request), { accept: request.headers.get('accept') })
}

// The apps are built per request because each binds one store; building one is a few route regexes.
async function route(request: Request, scope: RequestScope, o: RouteDeps): Promise<Response> {
  try {
    const url = new URL(request.url)
    if (o.adminOn && url.pathname.startsWith(adminPrefix)) {
      url.pathname = url.pathname.slice(adminPrefix.length - 1)
      // Only /rules needs the rules: /health must answer while the store is down.
      const rulesPath = url.pathname === '/rules' || url.pathname.startsWith('/rules/')
      const rules = rulesPath ? { rules: { registry: (await o.rules.forRequest(scope.db)).registry, db: scope.db } } : {}
      return await createAdminApp({ store: scope.store, authenticate: o.authenticate, ...rules }).fetch(new Request(url, request))
    }
    const { rules } = await o.rules.forRequest(scope.db)
    // The job API on the request's connection: without LISTEN, a waiting claim polls on the fallback tick.
    return await createApp({
      config: o.config, store: scope.store, forward: scope.forward, jobs: createJobStore(scope.db), rules: { current: () => rules },
      authenticate: o.authenticate, log: o.log, ...(o.attest ? { attest: o.attest } : {}),
    }).fetch(request)
  } catch (err) {
    // Reading the rules failed: nothing was judged or forwarded, as for any other store failure.
    if (!(err instanceof StoreError)) throw err
    const requestId = requestIdOf(request)
    return problemResponse(failureProblem(err, o.log, requestId, 'the store could not be reached; nothing was changed'), requestId)
  }
}

interface RouteDeps {
  config: Config
  authenticate: Authenticate
  log: Logger
  adminOn: boolean
  attest: AttestationSigner | undefined
  rules: WorkerRules
}

/** FENCEGATE_RULES_CHECK_MS: how stale an isolate's rules may be, in milliseconds (0 checks on every request). */
function rulesCheckMs(vars: Record<string, string | undefined>): number {
  const raw = vars.FENCEGATE_RULES_CHECK_MS
  if (raw === undefined || raw === '') return defaultRulesCheckMs
  if (!/^(0|[1-9][0-9]{0,6})$/.test(raw)) throw new ConfigError([`FENCEGATE_RULES_CHECK_MS: expected whole milliseconds, 0 to 9999999, got ${JSON.stringify(raw)}`])
  return Number(raw)
}
