import type { Answer } from '../http/exchange.js'
import type { Logger } from '../observe/log.js'
import { requireScopes } from '../http/identity.js'
import { refuseMethodOverride } from '../http/method-override.js'
import { resultTypeRequired } from '../http/jsonrpc.js'
import { durabilityProblem, FencegateError, problemAnswer, storeUnavailable, type ProblemRendering } from '../http/problems.js'
import type { RuleSet } from '../rules/registry.js'
import { StoreError, storeCode } from '../store/db.js'
import { DurabilityRefusal } from '../store/durability.js'
import type { Command, Held, IdempotencyClaim, Reservation, SlotRequest as Slot } from '../store/store.js'
import { mayHaveReserved } from './abandoned.js'
import { echoIdempotencyKey, hintReplay } from './answer-headers.js'
import { audited, auditRejection } from './audited.js'
import { entityOf, entitySources, leaseJobOf } from './command.js'
import { contextOf, type PipelineContext, type PipelineDeps } from './context.js'
import { clientResponseHeaders } from './forward.js'
import type { BodySource, Inbound } from '../http/inbound.js'
import { giveSlotBack, takeSlot } from './ordering.js'
import { readMcpMessage, replayForMessage, type McpMessage } from './mcp.js'
import { logged, settleResponse } from './outcome.js'
import { parseCommand, type CommandInput } from './parse-command.js'
import { answerReservation, reserve } from './reservation.js'
import { withRetryHint } from './retry-hint.js'
import type { Route } from './route.js'
import { logDecision, type Trace } from './trace.js'
import { startRequestSpan } from './spans.js'
import { storeSpans } from '../observe/store-spans.js'
import { correlatedLogger, traceIdOf, type OpenSpan } from '../observe/tracing.js'
import { forwardUpstream } from './upstream.js'

export type { PipelineDeps } from './context.js'
export type { Trace } from './trace.js'

// A delivery slot outlives the upstream timeout a little, so it never frees before the forward gave up.
const slotMarginMs = 1000

/** The request body as the pipeline holds it: bytes when checked (hashed, parsed), else a counted stream. */
interface HeldBody {
  bytes: Uint8Array | undefined
  body: BodySource
  exceeded: () => boolean
}

/**
 * The data-plane request pipeline, top to bottom:
 * route → identity → body → fence and key → reserve → (delivery slot) → forward → record → respond.
 * Each step is a function of its own module over the request and the trace; this one only
 * orders them. It reads a plain `Inbound` and gives a plain `Answer`, so each runtime moves
 * the bytes its own way. A refusal is answered here, as a problem in the route's
 * `error_envelope` and the media type the client's `Accept` asks for, so that every refusal of
 * a route (a stale fence, a key conflict, a store that is down) speaks its clients' SDK.
 *
 * @example
 * const handle = createPipeline({ config, rules: staticRules(config), store, forward, authenticate, log, metrics })
 * const answer = await handle(webInbound(request), crypto.randomUUID())
 */
export function createPipeline(deps: PipelineDeps) {
  const ctx = contextOf(deps)
  return function handle(request: Inbound, requestId: string): Promise<Answer> {
    const started = performance.now()
    const span = startRequestSpan(ctx.tracing, request)
    const trace: Trace = { requestId, method: request.method, path: request.url.pathname, span }
    return decide(ctx.tracing.enabled ? traced(ctx, span) : ctx, request, trace, started)
  }
}

/** A traced command's context: its store calls are spans under its own, and its log lines carry its ids. */
function traced(ctx: PipelineContext, span: OpenSpan): PipelineContext {
  return { ...ctx, store: storeSpans(ctx.store, span, ctx.tracing, ctx.storeSystem), log: correlatedLogger(ctx.log, span) }
}

/** One request through the steps. */
async function decide(ctx: PipelineContext, request: Inbound, trace: Trace, started: number): Promise<Answer> {
  const url = request.url
  const requestId = trace.requestId
  try {
    // 1. Route: only configured routes are forwarded; the gateway is never an open proxy.
    const matched = matchRoute(ctx, request, url, trace)
    const { params, rules } = matched
    // 2. Identity: the tenant comes from the verified token, never from the request.
    trace.identity = await ctx.authenticate(request)
    // 2b. An MCP POST: read its one JSON-RPC message and choose its rule, whose Route decides it from here.
    const message = matched.route.mcp && request.method === 'POST' ? await readMcpMessage(ctx, request, matched.route, trace) : undefined
    if (message) request = message.request
    const route = trace.route!
    if (route.config.scopes.length > 0) await audited(ctx, trace, async () => requireScopes(trace.identity!, route.config.scopes))
    // 3. Body: buffered when its hash is recorded (fenced or idempotent), else streamed.
    const body = await takeBody(ctx, request, route, trace, message)
    // 4. Fence and key: parse both, resolve the entity, then reserve in one store call.
    const reserved = body.bytes ? await reserveCommand(ctx, { request, url, params, bytes: body.bytes, fields: message?.fields, payload: message?.payload }, trace, rules) : {}
    if (reserved.replay) return replayed(ctx, request, reserved.replay, trace, started)
    const held = reserved.held
    // 4b. Ordering: with `serialize`, wait for the entity's delivery slot; a newer fence meanwhile makes this one stale.
    const slot = trace.ordering === 'serialize' ? await takeDeliverySlot(ctx, trace, held) : undefined
    // 5. Forward to the route's upstream.
    let upstream: Answer
    try {
      upstream = await forwardUpstream(ctx, { request, url, route, body: body.body, bodyExceeded: body.exceeded, held }, trace)
    } finally {
      // The upstream has answered (or failed): the next command for this entity may go.
      if (slot) await giveSlotBack(ctx.store, ctx.log, requestId, slot)
    }
    // 6. Record and respond: stream the answer back, storing it for replay when a key is held.
    return await respond(ctx, request, upstream, held, trace, started)
  } catch (err) {
    return problemAnswer(rejected(ctx, err, request, trace, started), requestId, renderingOf(request, trace))
  }
}

/** A stored answer given to a duplicate, in the route's terms (an MCP message's with its own id). */
function replayed(ctx: PipelineContext, request: Inbound, replay: Answer, trace: Trace, started: number): Answer {
  const rc = trace.route!.config
  const answer = trace.route!.answers === 'jsonrpc' ? replayForMessage(replay, trace.rpc?.id) : replay
  echoIdempotencyKey(answer.headers, request, rc)
  hintReplay(answer.headers, rc)
  logDecision(ctx, trace, 'replayed', answer.status, started)
  return answer
}

/**
 * The answer shape of a refusal, chosen once per route: problem+json in the route's envelope
 * and the client's media type, or on an MCP route a JSON-RPC error answer to the message's id
 * (a notification, which has none, is told by the HTTP status, as MCP's transport says).
 */
function renderingOf(request: Inbound, trace: Trace): ProblemRendering {
  const route = trace.route
  if (route?.answers === 'jsonrpc' && !(trace.rpc && trace.rpc.id === undefined)) {
    const toolError = route.config.mcp_refusals === 'tool_error' && trace.rpc?.method === 'tools/call' && trace.rpc.name !== undefined
    return { jsonrpc: { id: trace.rpc?.id ?? null, ...(toolError ? { toolError: { resultType: resultTypeRequired(request.headers.get('mcp-protocol-version')) } } : {}) } }
  }
  return { envelope: route?.config.error_envelope, accept: request.headers.get('accept') }
}

function matchRoute(ctx: PipelineContext, request: Inbound, url: URL, trace: Trace): { route: Route; params: Record<string, string>; rules: RuleSet } {
  const rules = ctx.rules.current()
  trace.ruleVersion = rules.version
  const match = rules.router.match(request.method, url.pathname)
  if (!match) throw new FencegateError('no_route', `no route for ${request.method} ${url.pathname}`)
  trace.route = match.route
  refuseMethodOverride(url)
  trace.auditEntity = () => entityOf(match.route, entitySources(request, url, match.params, new Uint8Array(0)))
  return { ...match, rules }
}

const notExceeded = () => false

async function takeBody(ctx: PipelineContext, request: Inbound, route: Route, trace: Trace, message: McpMessage | undefined): Promise<HeldBody> {
  const rc = route.config
  const checked = rc.fence !== 'off' || rc.idempotency !== 'off' || rc.claimed_tenant !== undefined
  if (!checked) {
    // An MCP message was read whole to choose its rule: it goes on as those bytes.
    if (message) return { bytes: undefined, body: message.bytes, exceeded: notExceeded }
    const passed = await request.passBody(ctx.bodyLimit)
    return { bytes: undefined, body: passed.body, exceeded: passed.exceeded }
  }
  let bytes: Uint8Array
  try {
    bytes = message?.bytes ?? await request.readBody(ctx.bodyLimit)
    trace.bodySha256 = await ctx.digest(bytes)
  } catch (err) {
    await auditRejection(ctx, trace, err)
    throw err
  }
  return { bytes, body: bytes, exceeded: notExceeded }
}

/** Parses and reserves a checked command: a replay to answer at once, or the key now held (if any). */
async function reserveCommand(ctx: PipelineContext, input: CommandInput, trace: Trace, rules: RuleSet): Promise<{ replay?: Answer; held?: Held }> {
  let claim: IdempotencyClaim | null
  try {
    claim = await parseCommand(ctx, input, trace, rules)
  } catch (err) {
    await auditRejection(ctx, trace, err)
    throw err
  }
  if (trace.fence === undefined && !claim) return {}
  const rc = trace.route!.config
  const identity = trace.identity!
  const command: Command = {
    tenant: identity.tenant, route: rc.name, entity: trace.entity ?? null, fence: trace.fence ?? null,
    method: trace.method, path: trace.path, bodySha256: trace.bodySha256 ?? null,
    caller: identity.caller, requestId: trace.requestId, idempotency: claim, leaseJob: leaseJobOf(rc.fence, trace.entity),
    traceId: traceIdOf(trace.span),
  }
  const held = claim ? { tenant: identity.tenant, key: claim.key, ownerToken: claim.ownerToken } : undefined
  let reservation: Reservation
  try {
    reservation = await reserve(ctx, command, trace)
  } catch (err) {
    // Its key may be reserved for this attempt, which forwards nothing: free it for the retry.
    if (held && mayHaveReserved(err)) await ctx.abandoned.release(held, claim!.lockMs, trace.requestId)
    throw err
  }
  const replay = await answerReservation(ctx, reservation, command, trace)
  if (replay) return { replay }
  return held ? { held } : {}
}

async function takeDeliverySlot(ctx: PipelineContext, trace: Trace, held: Held | undefined): Promise<Slot | undefined> {
  if (trace.ordering !== 'serialize' || trace.fence === undefined || trace.entity === undefined) return undefined
  const rc = trace.route!.config
  const slot: Slot = { tenant: trace.identity!.tenant, entity: trace.entity, fence: trace.fence, token: crypto.randomUUID(), holdMs: rc.timeout_ms + slotMarginMs }
  try {
    await audited(ctx, trace, () => takeSlot(ctx.store, slot, rc.ordering_wait))
    return slot
  } catch (err) {
    // Nothing was sent: the key is free for the next attempt.
    if (held) await logged(ctx.log, trace.requestId, 'release', () => ctx.store.release(held))
    throw err
  }
}

async function respond(ctx: PipelineContext, request: Inbound, upstream: Answer, held: Held | undefined, trace: Trace, started: number): Promise<Answer> {
  const rc = trace.route!.config
  const headers = clientResponseHeaders(upstream.headers)
  headers.set('x-request-id', trace.requestId)
  echoIdempotencyKey(headers, request, rc)
  const responseBody = held ? await settleResponse({ store: ctx.store, log: ctx.log, route: rc, held, upstream, requestId: trace.requestId }) : upstream.body
  // A captured body ends only once its record is stored; a length would let the client finish earlier.
  if (held && responseBody !== upstream.body) headers.delete('content-length')
  logDecision(ctx, trace, 'forwarded', upstream.status, started)
  return { status: upstream.status, headers, body: responseBody }
}

/** The problem a failure becomes, logged and counted: store failures fail closed as 503; anything unexpected is an internal error. */
function rejected(ctx: PipelineContext, err: unknown, request: Inbound, trace: Trace, started: number): FencegateError {
  const problem = withRetryHint(failureProblem(err, ctx.log, trace.requestId, 'the store could not record this command, so it was not forwarded'), trace.route?.config)
  if (trace.route) echoIdempotencyKey(problem.headers, request, trace.route.config)
  logDecision(ctx, trace, 'rejected', problem.status, started, problem.code)
  return problem
}

/**
 * What the data plane (commands and the job API) answers for a failure, logged by identifiers
 * only: a refusal as it is, a store failure as a retryable 503 saying `storeDetail`, anything
 * else as an internal error.
 */
export function failureProblem(err: unknown, log: Logger, requestId: string, storeDetail: string): FencegateError {
  if (err instanceof StoreError) {
    log.error('store_failed', { request_id: requestId, store_code: storeCode(err) })
    return storeUnavailable(storeDetail)
  }
  if (err instanceof DurabilityRefusal) return durabilityProblem(err)
  const problem = err instanceof FencegateError ? err : new FencegateError('internal_error', 'an unexpected error occurred')
  // A bug, or a state validation should have excluded (an attestation without a key).
  if (problem.code === 'internal_error') log.error('internal_error', { request_id: requestId, error: (err as Error)?.name ?? typeof err })
  return problem
}
