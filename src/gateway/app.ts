import { Hono } from 'hono'
import type { AttestationSigner } from './attest.js'
import type { Digest } from '../http/body.js'
import type { Config } from '../config/schema.js'
import type { Forward } from './forward.js'
import { noAuthentication, type Authenticate } from '../http/identity.js'
import { createJobsApi, jobRouteOf, jobsPath, type JobSpanRoute } from '../leases/api.js'
import type { JobSpanNotes } from '../leases/api-context.js'
import type { JobStore } from '../leases/store.js'
import type { ClaimWake } from '../leases/wake.js'
import { silentLogger, type Logger } from '../observe/log.js'
import { noMetrics, type Metrics } from '../observe/metrics.js'
import { storeSpans } from '../observe/store-spans.js'
import { correlatedLogger, noTracing, traceIdOf, type OpenSpan, type Tracing } from '../observe/tracing.js'
import { endJobSpan, startRequestSpan } from './spans.js'
import { createPipeline, failureProblem } from './pipeline.js'
import { toResponse, type Answer, type HeaderView } from '../http/exchange.js'
import { FencegateError, problemAnswer, problemResponse } from '../http/problems.js'
import { webInbound, type Inbound } from '../http/inbound.js'
import { browserRefusal, type BrowserGuard } from '../http/browser-guard.js'
import { staticRules, type RuleSource } from '../rules/registry.js'
import type { Store } from '../store/store.js'
import type { OutcomeWaits } from './outcome-waits.js'

/** What the data plane is built from; every part is injected so each runtime wires its own. */
export interface AppDeps {
  config: Config
  store: Store
  forward: Forward
  /** The lease service's statements; without them `/_fencegate/jobs` is not served. */
  jobs?: JobStore
  /** Wakes waiting claims; defaults to one LISTEN through `jobs.listenForWork` with a 1 s shared fallback poll, `job_waiting_claims` per tenant. */
  claimWake?: ClaimWake
  /** Defaults to no authentication: every request is tenant `default`. */
  authenticate?: Authenticate
  log?: Logger
  /** The rules requests are judged by; defaults to the configuration file's, as version 0 (src/rules/registry.ts). */
  rules?: RuleSource
  /** Defaults to recording nothing; Node passes prom-client metrics (src/runtime/node/metrics.ts). */
  metrics?: Metrics
  /** SHA-256 in hex; defaults to Web Crypto, Node passes node:crypto's (src/runtime/node/hash.ts). */
  digest?: Digest
  /** Signs `Fence-Attestation` (src/attest.ts); required when a route has `attest: true`. */
  attest?: AttestationSigner
  /** Without auth, keeps web pages out (src/http/browser-guard.ts); Node passes one, a public Worker none. */
  browserGuard?: BrowserGuard
  /** Spans per request (src/observe/tracing.ts); defaults to none. Node passes OpenTelemetry's when configured. */
  tracing?: Tracing
  /** `db.system.name` of the store's spans: `postgresql` (the default) or `pglite`. */
  storeSystem?: string
  /** How duplicates wait on in-flight keys (src/gateway/outcome-waits.ts); defaults to a budget of half `store.max_connections`. */
  outcomeWaits?: OutcomeWaits
}

export type AppEnv = { Variables: { requestId: string } }

const requestIdPattern = /^[A-Za-z0-9._:-]{1,128}$/

/** Accepts a well-formed `X-Request-Id` or makes one, so every answer and log line carries an id. */
export function requestIdOf(request: { headers: HeaderView }): string {
  const given = request.headers.get('x-request-id')
  return given !== null && requestIdPattern.test(given) ? given : crypto.randomUUID()
}

/**
 * Builds the data-plane Hono app. It imports nothing from `node:*`, so the same
 * core runs on Node and on fetch-based runtimes.
 *
 * @example
 * const app = createApp({ config, store: createStore(await openPglite()), forward: createUndiciForward() })
 * const res = await app.request('/payments/42/capture', { method: 'POST', headers: { 'x-execution-fence': '7' } })
 */
export function createApp(deps: AppDeps): Hono<AppEnv> {
  return createDataPlane(deps).app
}

/** The data plane's command pipeline over plain requests and answers (see `createPipeline`). */
export type HandleCommand = (request: Inbound, requestId: string) => Promise<Answer>

/**
 * The data plane over one handler: the job API first (when `jobs` is given), then the
 * command pipeline. Node's own server calls `handle` with a request it read straight off
 * the socket (src/runtime/node/data-plane.ts); `app` is the same handler as a Hono app, for
 * fetch-based runtimes and `app.request()`.
 *
 * @example
 * const { app, handle } = createDataPlane({ config, store, forward })
 */
export function createDataPlane(deps: AppDeps): { app: Hono<AppEnv>; handle: HandleCommand } {
  const tracing = deps.tracing ?? noTracing
  const storeSystem = deps.storeSystem ?? 'postgresql'
  const log = deps.log ?? silentLogger
  const metrics = deps.metrics ?? noMetrics
  const rules = deps.rules ?? staticRules(deps.config)
  const authenticate = deps.authenticate ?? noAuthentication
  const command = createPipeline({ ...deps, authenticate, rules, log, metrics, tracing })
  const jobsApi = deps.jobs && createJobsApi({ config: deps.config, jobs: deps.jobs, authenticate, log, wake: deps.claimWake, metrics, audit: (r) => deps.store.recordRejection(r) })
  const serveJobs = async (request: Inbound, requestId: string, traced?: { span: OpenSpan; route: JobSpanRoute; notes?: JobSpanNotes }): Promise<Answer> => {
    let answer: Answer | undefined
    try {
      // A traced call's statements are spans under its own, its log lines and audit rows carry its ids, and its route notes what its span shows.
      answer = await jobsApi!(request, requestId, traced && { jobs: storeSpans(deps.jobs!, traced.span, tracing, storeSystem), log: correlatedLogger(log, traced.span), traceId: traceIdOf(traced.span), notes: traced.notes })
    } catch (err) {
      const problem = failureProblem(err, log, requestId, 'the store could not be reached; nothing was changed')
      if (traced) endJobSpan(traced.span, request.method, traced.route, traced.notes, problem.status, problem.code)
      return problemAnswer(problem, requestId, { accept: request.headers.get('accept') })
    }
    if (traced && answer) endJobSpan(traced.span, request.method, traced.route, traced.notes, answer.status)
    return answer ?? command(request, requestId)
  }
  const routed: HandleCommand = !jobsApi ? command : async (request, requestId) => {
    // A path under the job API's prefix that is none of its routes goes on to the pipeline (no_route).
    if (!request.url.pathname.startsWith(jobsPath)) return command(request, requestId)
    const route = tracing.enabled ? jobRouteOf(request.method, request.url.pathname) : undefined
    if (!route) return serveJobs(request, requestId)
    const span = startRequestSpan(tracing, request)
    // Notes only for a span that records: an unsampled call's routes write nothing.
    return serveJobs(request, requestId, { span, route, notes: span.sampled ? {} : undefined })
  }
  const guard = deps.browserGuard
  const handle: HandleCommand = !guard ? routed : async (request, requestId) => {
    const refusal = browserRefusal(request.headers, request.method, guard, request.url.pathname.startsWith(jobsPath))
    if (!refusal) return routed(request, requestId)
    log.info('browser_refused', { request_id: requestId, code: refusal.code })
    return problemAnswer(refusal, requestId, { accept: request.headers.get('accept') })
  }
  const app = new Hono<AppEnv>()
  app.all('*', async (c) => {
    const requestId = requestIdOf(c.req.raw)
    c.set('requestId', requestId)
    try {
      return toResponse(await handle(webInbound(c.req.raw), requestId))
    } catch (err) {
      // The pipeline throws its failures as the problem to answer (as on Node, data-plane.ts).
      return toResponse(problemAnswer(err, requestId, { accept: c.req.header('accept') }))
    }
  })
  // Both handlers answer every failure themselves; this is the last resort.
  app.onError((err, c) => {
    log.error('internal_error', { request_id: c.get('requestId'), error: (err as Error)?.name ?? typeof err })
    return problemResponse(new FencegateError('internal_error'), c.get('requestId'))
  })
  return { app, handle }
}
