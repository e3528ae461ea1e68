import {
  ATTR_HTTP_REQUEST_METHOD, ATTR_HTTP_REQUEST_METHOD_ORIGINAL, ATTR_HTTP_RESPONSE_STATUS_CODE, ATTR_HTTP_ROUTE,
  ATTR_SERVER_ADDRESS, ATTR_SERVER_PORT, ATTR_URL_FULL, ATTR_URL_PATH, ATTR_URL_SCHEME,
} from '@opentelemetry/semantic-conventions'
import type { RouteConfig } from '../config/schema.js'
import type { Inbound } from '../http/inbound.js'
import type { JobSpanRoute } from '../leases/api.js'
import type { JobSpanNotes } from '../leases/api-context.js'
import type { ProblemCode } from '../http/problems.js'
import type { HeaderSink, OpenSpan, Tracing } from '../observe/tracing.js'

const none = {}

// The methods the HTTP semantic conventions name; any other is `_OTHER` (its spelling goes in http.request.method_original).
const knownMethods = new Set(['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'CONNECT', 'OPTIONS', 'TRACE', 'PATCH', 'QUERY'])

/** `http.request.method`: the method, or `_OTHER` for one the conventions do not name. */
function semconvMethod(method: string): string {
  return knownMethods.has(method) ? method : '_OTHER'
}

/** `http.request.method_original`: set only for an `_OTHER` method (undefined is left out of the span). */
function originalMethod(method: string): string | undefined {
  return knownMethods.has(method) ? undefined : method
}

function spanMethod(method: string): string {
  return knownMethods.has(method) ? method : 'HTTP'
}

/**
 * Starts a data-plane request's SERVER span, named by its method until routing names the
 * route (never by the raw path: paths carry entity ids, a trace backend's names must not).
 */
export function startRequestSpan(tracing: Tracing, request: Pick<Inbound, 'method' | 'url' | 'headers'>): OpenSpan {
  if (!tracing.enabled) return tracing.server('', request.headers, none)
  // One object literal per span: the SDK copies it once and leaves the undefined values out.
  return tracing.server(spanMethod(request.method), request.headers, {
    [ATTR_HTTP_REQUEST_METHOD]: semconvMethod(request.method),
    [ATTR_HTTP_REQUEST_METHOD_ORIGINAL]: originalMethod(request.method),
    [ATTR_URL_PATH]: request.url.pathname,
    [ATTR_URL_SCHEME]: request.url.protocol.slice(0, -1),
  })
}

/**
 * Starts an admin-plane request's SERVER span: as a data-plane one, but without `url.path`
 * until routing has matched its template (`endAdminSpan`). Admin paths carry what a trace
 * backend must not hold in clear: an idempotency key (`/idempotency/{key}`), an entity.
 */
export function startAdminSpan(tracing: Tracing, request: Pick<Inbound, 'method' | 'url' | 'headers'>): OpenSpan {
  if (!tracing.enabled) return tracing.server('', request.headers, none)
  return tracing.server(spanMethod(request.method), request.headers, {
    [ATTR_HTTP_REQUEST_METHOD]: semconvMethod(request.method),
    [ATTR_HTTP_REQUEST_METHOD_ORIGINAL]: originalMethod(request.method),
    [ATTR_URL_SCHEME]: request.url.protocol.slice(0, -1),
  })
}

/**
 * A route template as a path with its parameters named, not filled in: `/idempotency/:key`
 * becomes `/idempotency/{key}`, as the job API's span names show theirs.
 *
 * @example templatedPath('/entities/:entity/bump') // '/entities/{entity}/bump'
 */
export function templatedPath(template: string): string {
  return template.replace(/:([A-Za-z0-9_]+)(\{[^}]*\})?/g, '{$1}')
}

/** What the decision's span reads of the pipeline's `Trace`. */
export interface DecidedRequest {
  span?: OpenSpan
  method: string
  requestId: string
  route?: { config: RouteConfig }
  fence?: string
  entity?: string
  idempotencyOutcome?: string
}

/**
 * The decision on the SERVER span, then its end: `{METHOD} {route path}`, the route, the
 * decision (`forwarded`, `replayed` or the problem code), fence, entity and key outcome. A 4xx
 * is the client's (status left unset); a 5xx is ERROR, typed by the problem code or the status.
 */
export function endRequestSpan(trace: DecidedRequest, decision: 'forwarded' | 'replayed' | ProblemCode, status: number, code: ProblemCode | undefined, withEntity: boolean): void {
  const span = trace.span!
  const route = trace.route?.config
  if (route) span.rename(`${spanMethod(trace.method)} ${route.path}`)
  span.set({
    [ATTR_HTTP_ROUTE]: route?.path,
    [ATTR_HTTP_RESPONSE_STATUS_CODE]: status,
    'fencegate.route': route?.name,
    'fencegate.decision': decision,
    'fencegate.fence': trace.fence,
    // An entity names a customer's object (`invoice:42`): `telemetry.entity: false` keeps it out of the tracing backend.
    'fencegate.entity': withEntity ? trace.entity : undefined,
    'fencegate.idempotency.outcome': trace.idempotencyOutcome,
    'fencegate.request_id': trace.requestId,
  })
  span.end(status >= 500 ? (code ?? String(status)) : undefined)
}

/**
 * The SERVER span of a job API call, ended with its answer: named by the route's template,
 * with the job id (`fencegate.job.id`: the path's, or a one-job claim's), the fence presented
 * or issued, a batch claim's `fencegate.job.count`, the lease's outcome (`renewed`,
 * `completed`… or, on a lease route, the refusal's problem code) and a refusal's code as the
 * decision. An unsampled span records nothing: its attributes are not even built.
 */
export function endJobSpan(span: OpenSpan, method: string, route: JobSpanRoute, notes: JobSpanNotes | undefined, status: number, code?: ProblemCode): void {
  if (!span.sampled) return span.end()
  span.rename(`${spanMethod(method)} ${route.template}`)
  span.set({
    [ATTR_HTTP_ROUTE]: route.template,
    [ATTR_HTTP_RESPONSE_STATUS_CODE]: status,
    'fencegate.job.id': route.id ?? notes?.jobId,
    'fencegate.fence': notes?.fence,
    'fencegate.job.count': notes?.count,
    'fencegate.lease.outcome': code !== undefined ? (route.lease ? code : undefined) : notes?.outcome,
    'fencegate.decision': code,
  })
  span.end(status >= 500 ? (code ?? String(status)) : undefined)
}

/**
 * The SERVER span of an admin-plane request (src/admin/app.ts), ended with its answer: named
 * `{METHOD} {route template}` as Hono matched it (`POST /entities/:entity/bump`, the same
 * template the admin metrics count by), the method alone when no route matched; `url.path`
 * is the template with its parameters named (`/entities/{entity}/bump`), absent when none
 * matched: the path as sent never reaches the span. A refusal's problem code is the decision.
 */
export function endAdminSpan(span: OpenSpan, method: string, template: string | undefined, status: number, code?: string): void {
  if (template !== undefined) span.rename(`${spanMethod(method)} ${template}`)
  span.set({
    [ATTR_URL_PATH]: template === undefined ? undefined : templatedPath(template),
    [ATTR_HTTP_ROUTE]: template,
    [ATTR_HTTP_RESPONSE_STATUS_CODE]: status,
    'fencegate.decision': code,
  })
  span.end(status >= 500 ? (code ?? String(status)) : undefined)
}

/** The upstream URL as a span may show it: the query's names kept, its values not (they can carry data). */
export function redactedUrl(route: RouteConfig, target: string): string {
  const q = target.indexOf('?')
  const path = q < 0 ? target : target.slice(0, q)
  const base = route.upstream.origin + route.upstream.basePath + path
  if (q < 0) return base
  const names = target.slice(q + 1).split('&').filter(Boolean).map((pair) => {
    const eq = pair.indexOf('=')
    return eq < 0 ? pair : `${pair.slice(0, eq)}=REDACTED`
  })
  return `${base}?${names.join('&')}`
}

/** Starts the CLIENT span of one upstream attempt; its context goes into `headers` as `traceparent`. */
export function startUpstreamSpan(tracing: Tracing, parent: OpenSpan, route: RouteConfig, method: string, target: string, headers: HeaderSink): OpenSpan {
  // Not sampled: the upstream still gets a traceparent, but nobody reads the attributes.
  if (!parent.sampled) return tracing.client(parent, '', none, headers)
  const { address, port } = serverOf(route)
  return tracing.client(parent, spanMethod(method), {
    [ATTR_HTTP_REQUEST_METHOD]: semconvMethod(method),
    [ATTR_HTTP_REQUEST_METHOD_ORIGINAL]: originalMethod(method),
    [ATTR_SERVER_ADDRESS]: address,
    [ATTR_SERVER_PORT]: port,
    [ATTR_URL_FULL]: redactedUrl(route, target),
  }, headers)
}

// A route's upstream host and port, parsed once per route rather than per command.
const servers = new WeakMap<RouteConfig, { address: string; port: number }>()

function serverOf(route: RouteConfig): { address: string; port: number } {
  let server = servers.get(route)
  if (!server) {
    const origin = new URL(route.upstream.origin)
    server = { address: origin.hostname.replace(/^\[|\]$/g, ''), port: origin.port !== '' ? Number(origin.port) : origin.protocol === 'https:' ? 443 : 80 }
    servers.set(route, server)
  }
  return server
}

/** Ends an upstream attempt's span: a status of 400 or more is an error for a client span, typed by the status. */
export function endUpstreamSpan(span: OpenSpan, status: number): void {
  if (!span.sampled) return
  span.set({ [ATTR_HTTP_RESPONSE_STATUS_CODE]: status })
  span.end(status >= 400 ? String(status) : undefined)
}
