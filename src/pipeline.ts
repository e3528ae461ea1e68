import type { Config } from './config/schema.js'
import { readBody, limitBody, sha256Hex } from './body.js'
import { fenceHeader, parseFence, staleFenceError } from './fence.js'
import { clientResponseHeaders, ForwardError, upstreamRequestHeaders, type Forward } from './forward.js'
import { resolveIdentity, type Identity } from './identity.js'
import type { Logger } from './log.js'
import { FencegateError } from './problems.js'
import { resolveEntity, type Route, type Router } from './route.js'
import { StoreError } from './store/db.js'
import type { Store } from './store/store.js'

export interface PipelineDeps {
  config: Config
  router: Router
  store: Store
  forward: Forward
  log: Logger
}

/** What the pipeline learned about a request; logged once per decision. */
interface Trace {
  requestId: string
  method: string
  path: string
  route?: Route
  identity?: Identity
  entity?: string
  fence?: string
  bodySha256?: string | null
}

/**
 * The data-plane request pipeline, top to bottom:
 * route → identity → body → fence → forward → respond.
 * Each step's logic lives in its own module; this function only orders them.
 * Every error it throws is a FencegateError that the app renders as problem+json.
 */
export function createPipeline(deps: PipelineDeps) {
  const { config, router, store, forward, log } = deps
  const bodyLimit = config.server.max_request_body

  return async function handle(request: Request, requestId: string): Promise<Response> {
    const started = performance.now()
    const url = new URL(request.url)
    const trace: Trace = { requestId, method: request.method, path: url.pathname }
    try {
      // 1. Route: only configured routes are forwarded; the gateway is never an open proxy.
      const match = router.match(request.method, url.pathname)
      if (!match) throw new FencegateError('no_route', `no route for ${request.method} ${url.pathname}`)
      const { route, params } = match
      trace.route = route

      // 2. Identity: the tenant comes from authentication, never from the request body.
      trace.identity = resolveIdentity(request)

      // 3. Fence: parse, resolve the entity and present the fence to the store.
      //    A fenced command's body is buffered: its hash is recorded before forwarding.
      let body: Uint8Array | ReadableStream<Uint8Array> | null
      let bodyExceeded = () => false
      if (route.config.fence === 'off') {
        const limited = limitBody(request, bodyLimit)
        body = limited.body
        bodyExceeded = limited.exceeded
      } else {
        body = await audited(trace, async () => {
          const bytes = await readBody(request, bodyLimit)
          trace.bodySha256 = await sha256Hex(bytes)
          return bytes
        })
        await audited(trace, () => checkFence(request, url, params, body as Uint8Array, trace))
      }

      // 4. Forward to the route's upstream; the target path is the one we matched.
      const response = await forwardUpstream(request, url, route, body, bodyExceeded, requestId)

      // 5. Respond: stream the upstream's answer back.
      logDecision(trace, 'forwarded', response.status, started)
      return response
    } catch (err) {
      const problem = toProblem(err)
      if (problem.code === 'internal_error') log.error('internal_error', { request_id: requestId, error: (err as Error)?.name ?? typeof err })
      if (err instanceof StoreError) log.error('store_failed', { request_id: requestId, store_code: storeCode(err) })
      logDecision(trace, 'rejected', problem.status, started, problem.code)
      throw problem
    }
  }

  async function checkFence(request: Request, url: URL, params: Record<string, string>, bytes: Uint8Array, trace: Trace): Promise<void> {
    const route = trace.route!
    const fence = parseFence(request.headers.get(fenceHeader))
    if (fence === undefined) {
      if (route.config.fence === 'required') throw new FencegateError('fence_required', `route ${route.config.name} requires ${fenceHeader}`)
      return
    }
    trace.fence = fence
    let json: unknown
    let parsed = false
    trace.entity = resolveEntity(route.entity!, {
      params,
      query: url.searchParams,
      headers: request.headers,
      json: () => {
        if (!parsed) {
          parsed = true
          try {
            json = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes))
          } catch {
            json = undefined
          }
        }
        return json
      },
    })
    const identity = trace.identity!
    const decision = await store.admit({
      tenant: identity.tenant,
      route: route.config.name,
      entity: trace.entity,
      fence,
      method: trace.method,
      path: trace.path,
      bodySha256: trace.bodySha256 ?? null,
      caller: identity.caller,
      requestId: trace.requestId,
    })
    if (!decision.accepted) throw staleFenceError(trace.entity, fence, decision.highest)
  }

  /** Runs a step whose client-caused rejections are written to the audit trail. */
  async function audited<T>(trace: Trace, step: () => Promise<T>): Promise<T> {
    try {
      return await step()
    } catch (err) {
      // stale_fence is audited by the store in the statement that decided it.
      if (err instanceof FencegateError && err.status < 500 && err.code !== 'stale_fence') {
        await store.recordRejection({
          tenant: trace.identity!.tenant,
          route: trace.route!.config.name,
          entity: trace.entity ?? null,
          code: err.code,
          presentedFence: trace.fence ?? null,
          highestFence: null,
          method: trace.method,
          path: trace.path,
          bodySha256: trace.bodySha256 ?? null,
          caller: trace.identity!.caller,
          requestId: trace.requestId,
        }).catch((auditErr: unknown) => {
          // The client still learns what it got wrong; the lost row is logged by its id.
          log.error('audit_write_failed', { request_id: trace.requestId, code: err.code, store_code: storeCode(auditErr) })
        })
      }
      throw err
    }
  }

  async function forwardUpstream(
    request: Request, url: URL, route: Route,
    body: Uint8Array | ReadableStream<Uint8Array> | null, bodyExceeded: () => boolean, requestId: string,
  ): Promise<Response> {
    const headers = upstreamRequestHeaders(request.headers)
    headers.set('x-request-id', requestId)
    // Re-set after filtering: a client naming it in `Connection` must not hide the fence from the upstream.
    const fence = request.headers.get(fenceHeader)
    if (fence !== null) headers.set(fenceHeader, fence)
    let upstream: Response
    try {
      upstream = await forward({ route: route.config, target: url.pathname + url.search, method: request.method, headers, body })
    } catch (err) {
      if (bodyExceeded()) throw new FencegateError('body_too_large', `the request body exceeds ${bodyLimit} bytes`)
      if (err instanceof ForwardError) {
        if (err.kind === 'timeout') throw new FencegateError('upstream_timeout', `the upstream did not answer within ${route.config.timeout_ms} ms`)
        throw new FencegateError('upstream_unreachable', err.sent
          ? 'the connection to the upstream failed after the request was sent; its outcome is unknown'
          : 'the upstream refused or could not be reached; nothing was sent')
      }
      throw err
    }
    const responseHeaders = clientResponseHeaders(upstream.headers)
    responseHeaders.set('x-request-id', requestId)
    return new Response(upstream.body, { status: upstream.status, statusText: upstream.statusText, headers: responseHeaders })
  }

  function logDecision(trace: Trace, outcome: string, status: number, started: number, code?: string): void {
    log.info('request', {
      request_id: trace.requestId,
      route: trace.route?.config.name,
      method: trace.method,
      tenant: trace.identity?.tenant,
      entity: trace.entity,
      fence: trace.fence,
      outcome,
      code,
      status,
      duration_ms: Math.round((performance.now() - started) * 100) / 100,
    })
  }
}

/** Store failures fail closed as 503; anything unexpected is an internal error. */
function toProblem(err: unknown): FencegateError {
  if (err instanceof FencegateError) return err
  if (err instanceof StoreError) return new FencegateError('store_unavailable', 'the store could not record this command, so it was not forwarded')
  return new FencegateError('internal_error', 'an unexpected error occurred')
}

function storeCode(err: unknown): string {
  return err instanceof StoreError ? (err.sqlstate ?? err.driverCode ?? 'unknown') : 'unknown'
}
