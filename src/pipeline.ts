import { limitBody, readBody, sha256Hex } from './body.js'
import type { Config } from './config/schema.js'
import { fenceHeader, parseFence, staleFenceError } from './fence.js'
import { clientResponseHeaders, ForwardError, upstreamRequestHeaders, type Forward } from './forward.js'
import { fingerprint, idempotencyHeader, parseIdempotencyKey, replayResponse } from './idempotency.js'
import { requireScopes, type Authenticate, type Identity } from './identity.js'
import type { Logger } from './log.js'
import { logged, settleResponse, waitForOutcome } from './outcome.js'
import { FencegateError } from './problems.js'
import { resolveEntity, type Route, type Router } from './route.js'
import { StoreError, storeCode } from './store/db.js'
import type { Command, Held, IdempotencyClaim, Reservation, Store } from './store/store.js'

export interface PipelineDeps {
  config: Config
  router: Router
  store: Store
  forward: Forward
  authenticate: Authenticate
  log: Logger
}

/** What the pipeline learned about a request; logged once per decision, never with a body. */
export interface Trace {
  requestId: string
  method: string
  path: string
  route?: Route
  identity?: Identity
  entity?: string
  fence?: string
  key?: string
  keySha256?: string
  bodySha256?: string | null
}

type Body = Uint8Array | ReadableStream<Uint8Array> | null

/**
 * The data-plane request pipeline, top to bottom:
 * route → identity → body → fence and key → reserve → forward → record → respond.
 * Each step's logic lives in its own module; this function only orders them.
 * Every error it throws is a FencegateError that the app renders as problem+json.
 */
export function createPipeline(deps: PipelineDeps) {
  const { config, router, store, forward, authenticate, log } = deps
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
      const rc = route.config
      trace.route = route

      // 2. Identity: the tenant comes from the verified token, never from the request.
      trace.identity = await authenticate(request)
      await audited(trace, async () => requireScopes(trace.identity!, rc.scopes))

      // 3. Body: buffered when its hash is recorded (fenced or idempotent), else streamed.
      const checked = rc.fence !== 'off' || rc.idempotency !== 'off' || rc.claimed_tenant !== undefined
      let body: Body
      let bodyExceeded = () => false
      if (checked) {
        body = await audited(trace, async () => {
          const bytes = await readBody(request, bodyLimit)
          trace.bodySha256 = await sha256Hex(bytes)
          return bytes
        })
      } else {
        const limited = limitBody(request, bodyLimit)
        body = limited.body
        bodyExceeded = limited.exceeded
      }

      // 4. Fence and key: parse both, resolve the entity, then reserve in one statement.
      let held: Held | undefined
      if (checked) {
        const claim = await audited(trace, () => parseCommand(request, url, params, body as Uint8Array, trace))
        if (trace.fence !== undefined || claim) {
          const command: Command = {
            tenant: trace.identity.tenant, route: rc.name, entity: trace.entity ?? null, fence: trace.fence ?? null,
            method: trace.method, path: trace.path, bodySha256: trace.bodySha256 ?? null,
            caller: trace.identity.caller, requestId, idempotency: claim, leaseJob: leaseJobOf(rc.fence, trace.entity),
          }
          const early = await answerReservation(await store.reserve(command), command, trace)
          if (early) {
            logDecision(trace, 'replayed', early.status, started)
            return early
          }
          if (claim) held = { tenant: trace.identity.tenant, key: claim.key, ownerToken: claim.ownerToken }
        }
      }

      // 5. Forward to the route's upstream; the target path is the one that matched.
      const upstream = await forwardUpstream(request, url, route, body, bodyExceeded, requestId, held)

      // 6. Record and respond: stream the answer back, storing it for replay when a key is held.
      const headers = clientResponseHeaders(upstream.headers)
      headers.set('x-request-id', requestId)
      const responseBody = held ? await settleResponse({ store, log, route: rc, held, upstream, requestId }) : upstream.body
      // A captured body ends only once its record is stored; a length would let the client finish earlier.
      if (held && responseBody !== upstream.body) headers.delete('content-length')
      logDecision(trace, 'forwarded', upstream.status, started)
      return new Response(responseBody, { status: upstream.status, statusText: upstream.statusText, headers })
    } catch (err) {
      const problem = toProblem(err)
      if (problem.code === 'internal_error') log.error('internal_error', { request_id: requestId, error: (err as Error)?.name ?? typeof err })
      if (err instanceof StoreError) log.error('store_failed', { request_id: requestId, store_code: storeCode(err) })
      logDecision(trace, 'rejected', problem.status, started, problem.code)
      throw problem
    }
  }

  /** Parses the fence and the key and resolves the entity; returns the key's claim, if any. */
  async function parseCommand(request: Request, url: URL, params: Record<string, string>, bytes: Uint8Array, trace: Trace): Promise<IdempotencyClaim | null> {
    const rc = trace.route!.config
    if (rc.fence !== 'off') {
      trace.fence = parseFence(request.headers.get(fenceHeader))
      if (trace.fence === undefined && (rc.fence === 'required' || rc.fence === 'lease')) throw new FencegateError('fence_required', `route ${rc.name} requires X-Execution-Fence`)
    }
    if (rc.idempotency !== 'off') {
      trace.key = parseIdempotencyKey(request.headers.get(idempotencyHeader))
      if (trace.key === undefined && rc.idempotency === 'required') throw new FencegateError('idempotency_key_required', `route ${rc.name} requires Idempotency-Key`)
    }
    const sources = entitySources(request, url, params, bytes)
    if (rc.claimed_tenant) checkClaimedTenant(rc.claimed_tenant, sources, trace.identity!)
    if (trace.fence !== undefined) trace.entity = resolveEntity(trace.route!.entity!, sources)
    if (trace.key === undefined) return null
    trace.keySha256 = await sha256Hex(new TextEncoder().encode(trace.key))
    return {
      key: trace.key,
      fingerprint: await fingerprint(request.method, rc.name, url.pathname, url.search, bytes),
      ownerToken: crypto.randomUUID(),
      lockMs: rc.idempotency_lock,
      ttlMs: rc.idempotency_ttl,
      retryUnknown: rc.on_unknown_outcome === 'retry',
    }
  }

  /** Turns the store's decision into an answer, or undefined when the request may go upstream. */
  async function answerReservation(r: Reservation, command: Command, trace: Trace): Promise<Response | undefined> {
    switch (r.kind) {
      case 'proceed': return undefined
      case 'stale': throw staleFenceError(trace.entity!, trace.fence!, r.highest)
      case 'lease_expired': throw new FencegateError('lease_expired', `fence ${trace.fence} is not the current token of a live lease on ${trace.entity}`, { entity: trace.entity!, presented_fence: trace.fence! })
      case 'replay': return replayResponse(r.stored, trace.requestId)
      case 'reused': throw new FencegateError('idempotency_key_reused', 'this Idempotency-Key was used with a different method, path, query or body')
      case 'not_replayable': throw new FencegateError('response_not_replayable', 'the original response was larger than max_stored_body; it is not executed again')
      case 'outcome_unknown': throw new FencegateError('outcome_unknown', 'the original request may have reached the upstream but its answer was lost; reconcile, then release the key')
      case 'in_progress': {
        const rc = trace.route!.config
        if (rc.idempotency_wait > 0) {
          // The same command again: fence, lease and key are all decided anew.
          const settled = await waitForOutcome(store, command.tenant, command.idempotency!.key, rc.idempotency_wait)
          if (settled) return answerReservation(await store.reserve(command), command, trace)
        }
        const seconds = Math.max(1, Math.ceil(r.retryAfterMs / 1000))
        throw new FencegateError('request_in_progress', 'the original request is still being processed; retry later', {}, { 'retry-after': String(seconds) })
      }
    }
  }

  /** Runs a step whose client-caused rejections are written to the audit trail. */
  async function audited<T>(trace: Trace, step: () => Promise<T>): Promise<T> {
    try {
      return await step()
    } catch (err) {
      if (err instanceof FencegateError && err.status < 500) {
        await store.recordRejection({
          tenant: trace.identity!.tenant, route: trace.route!.config.name, entity: trace.entity ?? null, code: err.code,
          presentedFence: trace.fence ?? null, highestFence: null, method: trace.method, path: trace.path,
          bodySha256: trace.bodySha256 ?? null, caller: trace.identity!.caller, requestId: trace.requestId, idempotencyKey: trace.key ?? null,
        }).catch((auditErr: unknown) => {
          // The client still learns what it got wrong; the lost row is logged by its id.
          log.error('audit_write_failed', { request_id: trace.requestId, code: err.code, store_code: storeCode(auditErr) })
        })
      }
      throw err
    }
  }

  async function forwardUpstream(request: Request, url: URL, route: Route, body: Body, bodyExceeded: () => boolean, requestId: string, held: Held | undefined): Promise<Response> {
    const headers = upstreamRequestHeaders(request.headers)
    headers.set('x-request-id', requestId)
    // The caller's credentials are for fencegate; the upstream gets the route's own unless told otherwise.
    if (!route.config.forward_authorization) headers.delete('authorization')
    for (const [name, value] of Object.entries(route.config.upstream_headers)) headers.set(name, value)
    // Re-set after filtering: a client naming them in `Connection` must not hide from the upstream
    // the fence, or a header the entity or the claimed tenant was read from.
    for (const name of [fenceHeader, ...route.decisionHeaders]) {
      const value = request.headers.get(name)
      if (value !== null) headers.set(name, value)
    }
    try {
      return await forward({ route: route.config, target: url.pathname + url.search, method: request.method, headers, body })
    } catch (err) {
      if (bodyExceeded()) throw new FencegateError('body_too_large', `the request body exceeds ${bodyLimit} bytes`)
      if (!(err instanceof ForwardError)) throw err
      // Nothing sent: the key is free again. Possibly sent: the outcome is unknown.
      if (held) await logged(log, requestId, err.sent ? 'mark_unknown' : 'release', () => (err.sent ? store.markUnknown(held) : store.release(held)))
      if (err.kind === 'timeout') throw new FencegateError('upstream_timeout', `the upstream did not answer within ${route.config.timeout_ms} ms`)
      throw new FencegateError('upstream_unreachable', err.sent
        ? 'the connection to the upstream failed after the request was sent; its outcome is unknown'
        : 'the upstream refused or could not be reached; nothing was sent')
    }
  }

  function logDecision(trace: Trace, outcome: string, status: number, started: number, code?: string): void {
    log.info('request', {
      request_id: trace.requestId, route: trace.route?.config.name, method: trace.method, tenant: trace.identity?.tenant,
      entity: trace.entity, fence: trace.fence, key_sha256: trace.keySha256, outcome, code, status,
      duration_ms: Math.round((performance.now() - started) * 100) / 100,
    })
  }
}

/**
 * A tenant the request itself names (`claimed_tenant`) is evidence, never
 * authority: it must agree with the token's tenant or the request is refused.
 */
function checkClaimedTenant(where: string, sources: ReturnType<typeof entitySources>, identity: Identity): void {
  const claimed = readClaim(where, sources)
  if (claimed !== undefined && claimed !== identity.tenant) {
    throw new FencegateError('tenant_mismatch', `the request claims another tenant (${where}) than its token`)
  }
}

function readClaim(where: string, sources: ReturnType<typeof entitySources>): string | undefined {
  const [source, ...path] = where.split('.')
  if (source === 'header') return sources.headers.get(path[0]!) ?? undefined
  let node = sources.json()
  for (const key of path) {
    if (node === null || typeof node !== 'object' || !Object.hasOwn(node, key)) return undefined
    node = (node as Record<string, unknown>)[key]
  }
  return node === undefined ? undefined : String(node)
}

function entitySources(request: Request, url: URL, params: Record<string, string>, bytes: Uint8Array) {
  let json: unknown
  let parsed = false
  return {
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
  }
}

/** The job id behind a `fence: lease` entity (`job:42`); an id that cannot exist matches no lease. */
function leaseJobOf(mode: string, entity: string | undefined): string | null {
  if (mode !== 'lease') return null
  const id = entity?.slice('job:'.length) ?? ''
  return /^[1-9][0-9]{0,17}$/.test(id) ? id : '0'
}

/** Store failures fail closed as 503; anything unexpected is an internal error. */
function toProblem(err: unknown): FencegateError {
  if (err instanceof FencegateError) return err
  if (err instanceof StoreError) return new FencegateError('store_unavailable', 'the store could not record this command, so it was not forwarded')
  return new FencegateError('internal_error', 'an unexpected error occurred')
}
