import { attestationHeader, attestCommand, type AttestationSigner } from './attest.js'
import { limitBody, readBody, sha256Hex, type Digest } from './body.js'
import type { Config } from './config/schema.js'
import { fenceHeader, parseFence, staleFenceError } from './fence.js'
import { clientResponseHeaders, ForwardError, upstreamRequestHeaders, type Forward } from './forward.js'
import { idempotencyHeader, parseIdempotencyKey, payloadFingerprint, replayResponse } from './idempotency.js'
import { requireScopes, type Authenticate, type Identity } from './identity.js'
import type { Logger } from './log.js'
import type { Metrics, RequestOutcome } from './metrics.js'
import { logged, settleResponse, waitForOutcome } from './outcome.js'
import { FencegateError, type ProblemCode } from './problems.js'
import { checkClaimedTenant, commandPolicy, entityOf, entitySources, leaseJobOf, type CommandPolicy } from './command.js'
import { resolveEntity, type Route } from './route.js'
import { giveSlotBack, takeSlot } from './ordering.js'
import type { RuleSet, RuleSource } from './rules/registry.js'
import { StoreError, storeCode } from './store/db.js'
import type { Command, Held, IdempotencyClaim, Reservation, Store } from './store/store.js'

export interface PipelineDeps {
  config: Config
  /** Read once per request: a request is judged by one rule version from start to end. */
  rules: RuleSource
  store: Store
  forward: Forward
  authenticate: Authenticate
  log: Logger
  metrics: Metrics
  /** SHA-256 for the body, the key and the fingerprint; Web Crypto unless the runtime injects a faster one. */
  digest?: Digest
  /** Signs `Fence-Attestation` for routes with `attest: true`; absent when the gateway has no attestation key. */
  attest?: AttestationSigner
}

/** What the pipeline learned about a request; logged once per decision, never with a body. */
export interface Trace {
  requestId: string
  method: string
  path: string
  route?: Route
  identity?: Identity
  entity?: string
  /** The route's entity as far as the request resolves it, for audit rows of refusals decided before the fence. */
  auditEntity?: () => string | undefined
  fence?: string
  key?: string
  keySha256?: string
  bodySha256?: string | null
  ruleVersion?: number
  /** The delivery order the route or an entity rule asks for. */
  ordering?: 'none' | 'serialize'
  /** Milliseconds spent in store statements and in the forward step, for the decision's log line. */
  storeMs?: number
  upstreamMs?: number
}

type Body = Uint8Array | ReadableStream<Uint8Array> | null

// A delivery slot outlives the upstream timeout a little, so it never frees before the forward gave up.
const slotMarginMs = 1000

/**
 * The data-plane request pipeline, top to bottom:
 * route → identity → body → fence and key → reserve → forward → record → respond.
 * Each step's logic lives in its own module; this function only orders them.
 * Every error it throws is a FencegateError that the app renders as problem+json.
 */
export function createPipeline(deps: PipelineDeps) {
  const { config, rules: ruleSource, store, forward, authenticate, log, metrics } = deps
  const bodyLimit = config.server.max_request_body
  const digest = deps.digest ?? sha256Hex

  return async function handle(request: Request, requestId: string): Promise<Response> {
    const started = performance.now()
    const url = new URL(request.url)
    const trace: Trace = { requestId, method: request.method, path: url.pathname }
    try {
      // 1. Route: only configured routes are forwarded; the gateway is never an open proxy.
      const rules = ruleSource.current()
      trace.ruleVersion = rules.version
      const match = rules.router.match(request.method, url.pathname)
      if (!match) throw new FencegateError('no_route', `no route for ${request.method} ${url.pathname}`)
      const { route, params } = match
      const rc = route.config
      trace.route = route
      trace.auditEntity = () => entityOf(route, entitySources(request, url, params, new Uint8Array(0)))

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
          trace.bodySha256 = await digest(bytes)
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
        const claim = await audited(trace, () => parseCommand(request, url, params, body as Uint8Array, trace, rules))
        if (trace.fence !== undefined || claim) {
          const command: Command = {
            tenant: trace.identity.tenant, route: rc.name, entity: trace.entity ?? null, fence: trace.fence ?? null,
            method: trace.method, path: trace.path, bodySha256: trace.bodySha256 ?? null,
            caller: trace.identity.caller, requestId, idempotency: claim, leaseJob: leaseJobOf(rc.fence, trace.entity),
          }
          const early = await answerReservation(await reserve(command, trace), command, trace)
          if (early) {
            logDecision(trace, 'replayed', early.status, started)
            return early
          }
          if (claim) held = { tenant: trace.identity.tenant, key: claim.key, ownerToken: claim.ownerToken }
        }
      }

      // 4b. Ordering: with `serialize`, wait for the entity's delivery slot; a newer fence meanwhile makes this one stale.
      const slot = trace.ordering === 'serialize' && trace.fence !== undefined && trace.entity !== undefined
        ? { tenant: trace.identity.tenant, entity: trace.entity, fence: trace.fence, token: crypto.randomUUID(), holdMs: rc.timeout_ms + slotMarginMs }
        : undefined
      if (slot) {
        try {
          await audited(trace, () => takeSlot(store, slot, rc.ordering_wait))
        } catch (err) {
          // Nothing was sent: the key is free for the next attempt.
          if (held) await logged(log, requestId, 'release', () => store.release(held!))
          throw err
        }
      }

      // 5. Forward to the route's upstream; the target path is the one that matched.
      let upstream: Response
      try {
        upstream = await timed(trace, 'upstreamMs', () => forwardUpstream(request, url, route, body, bodyExceeded, requestId, held, trace))
      } finally {
        // The upstream has answered (or failed): the next command for this entity may go.
        if (slot) await giveSlotBack(store, log, requestId, slot)
      }

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
  async function parseCommand(request: Request, url: URL, params: Record<string, string>, bytes: Uint8Array, trace: Trace, rules: RuleSet): Promise<IdempotencyClaim | null> {
    const rc = trace.route!.config
    const sources = entitySources(request, url, params, bytes)
    trace.auditEntity = () => entityOf(trace.route!, sources)
    let policy: CommandPolicy
    try {
      policy = commandPolicy(trace.route!, trace.identity!.tenant, sources, rules)
    } catch (err) {
      // A frozen entity: its audit row names it.
      if (err instanceof FencegateError && err.code === 'entity_frozen') trace.entity = String(err.extras.entity)
      throw err
    }
    const mode = policy.fence
    trace.ordering = policy.ordering
    if (mode !== 'off') {
      trace.fence = parseFence(request.headers.get(fenceHeader))
      if (trace.fence === undefined && (mode === 'required' || mode === 'lease')) throw new FencegateError('fence_required', `route ${rc.name} requires X-Execution-Fence`)
    }
    if (rc.idempotency !== 'off') {
      trace.key = parseIdempotencyKey(request.headers.get(idempotencyHeader))
      if (trace.key === undefined && rc.idempotency === 'required') throw new FencegateError('idempotency_key_required', `route ${rc.name} requires Idempotency-Key`)
    }
    if (rc.claimed_tenant) checkClaimedTenant(rc.claimed_tenant, sources, trace.identity!)
    if (trace.fence !== undefined) trace.entity = policy.entity ?? resolveEntity(trace.route!.entity!, sources)
    if (trace.key === undefined) return null
    trace.keySha256 = await digest(new TextEncoder().encode(trace.key))
    return {
      key: trace.key,
      fingerprint: await payloadFingerprint(request.method, rc.name, url.pathname, url.search, trace.bodySha256 ?? await digest(bytes), digest),
      ownerToken: crypto.randomUUID(),
      lockMs: rc.idempotency_lock,
      ttlMs: rc.idempotency_ttl,
      retryUnknown: rc.on_unknown_outcome === 'retry',
    }
  }

  /** Presents the command to the store; a fence it accepts is written as the entity's highest. */
  async function reserve(command: Command, trace: Trace): Promise<Reservation> {
    const r = await timed(trace, 'storeMs', () => store.reserve(command))
    if (command.fence !== null && r.kind !== 'stale' && r.kind !== 'lease_expired') metrics.highestFenceUpdated({ route: command.route })
    return r
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
          if (settled) return answerReservation(await reserve(command, trace), command, trace)
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
        await timed(trace, 'storeMs', () => store.recordRejection({
          tenant: trace.identity!.tenant, route: trace.route!.config.name, entity: trace.entity ?? trace.auditEntity?.() ?? null, code: err.code,
          presentedFence: trace.fence ?? null, highestFence: null, method: trace.method, path: trace.path,
          bodySha256: trace.bodySha256 ?? null, caller: trace.identity!.caller, requestId: trace.requestId, idempotencyKey: trace.key ?? null,
        })).catch((auditErr: unknown) => {
          // The client still learns what it got wrong; the lost row is logged by its id.
          log.error('audit_write_failed', { request_id: trace.requestId, code: err.code, store_code: storeCode(auditErr) })
        })
      }
      throw err
    }
  }

  async function forwardUpstream(request: Request, url: URL, route: Route, body: Body, bodyExceeded: () => boolean, requestId: string, held: Held | undefined, trace: Trace): Promise<Response> {
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
    // Last, so that no client header (not even one re-set above) can pass for the gateway's attestation.
    headers.delete(attestationHeader)
    if (route.config.attest && trace.fence !== undefined) {
      try {
        headers.set(attestationHeader, await attestCommand(deps.attest, trace, url, route.config))
      } catch (err) {
        // Nothing was sent: the key is free for the next attempt.
        if (held) await logged(log, requestId, 'release', () => store.release(held))
        throw err
      }
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

  /** The decision's one log line and its metrics: identifiers, hashes and durations, never a body. */
  function logDecision(trace: Trace, outcome: RequestOutcome, status: number, started: number, code?: ProblemCode): void {
    const durationMs = performance.now() - started
    const route = trace.route?.config.name
    metrics.request({ route, outcome, code, durationMs })
    if (route !== undefined && trace.upstreamMs !== undefined) metrics.upstream({ route, durationMs: trace.upstreamMs })
    log.info('request', {
      request_id: trace.requestId, route, method: trace.method, tenant: trace.identity?.tenant,
      entity: trace.entity, fence: trace.fence, key_sha256: trace.keySha256, rule_version: trace.ruleVersion, outcome, code, status,
      duration_ms: roundMs(durationMs), store_ms: roundMs(trace.storeMs), upstream_ms: roundMs(trace.upstreamMs),
    })
  }
}

/** Runs a step, adding its duration to the trace's store or upstream time, whether it succeeds or throws. */
async function timed<T>(trace: Trace, into: 'storeMs' | 'upstreamMs', step: () => Promise<T>): Promise<T> {
  const started = performance.now()
  try {
    return await step()
  } finally {
    trace[into] = (trace[into] ?? 0) + performance.now() - started
  }
}

function roundMs(ms: number | undefined): number | undefined {
  return ms === undefined ? undefined : Math.round(ms * 100) / 100
}

/** Store failures fail closed as 503; anything unexpected is an internal error. */
function toProblem(err: unknown): FencegateError {
  if (err instanceof FencegateError) return err
  if (err instanceof StoreError) return new FencegateError('store_unavailable', 'the store could not record this command, so it was not forwarded')
  return new FencegateError('internal_error', 'an unexpected error occurred')
}
