import { toResponse, type Answer } from './exchange.js'
import { HeaderList } from './header-list.js'
import { envelopeMembers, problemMediaType, type ErrorEnvelope } from './envelopes.js'
import { invalidRequestCode, rpcErrorBody, rpcErrorCode, rpcToolErrorBody, type RpcId } from './jsonrpc.js'
/**
 * Every error fencegate answers with, in one place: a stable `code`, its HTTP
 * status and a title. Clients branch on `code`; titles are for people.
 */
export const problemCatalog = {
  no_route: { status: 404, title: 'No route matches this request' },
  invalid_request: { status: 400, title: 'The request is malformed' },
  unauthenticated: { status: 401, title: 'A valid bearer token is required' },
  tenant_missing: { status: 403, title: 'The token names no tenant' },
  tenant_mismatch: { status: 403, title: 'The request claims a tenant other than the token' },
  insufficient_scope: { status: 403, title: 'The token lacks a scope this route requires' },
  worker_mismatch: { status: 403, title: 'The request names another worker than its token' },
  invalid_fence: { status: 400, title: 'X-Execution-Fence is not a valid fence' },
  fence_required: { status: 428, title: 'This route requires X-Execution-Fence' },
  entity_unresolved: { status: 400, title: 'The entity could not be resolved from the request' },
  stale_fence: { status: 409, title: 'A higher fence has already been accepted for this entity' },
  body_too_large: { status: 413, title: 'The request body exceeds the configured limit' },
  invalid_idempotency_key: { status: 400, title: 'Idempotency-Key is not a valid key' },
  idempotency_key_required: { status: 400, title: 'This route requires an idempotency key' },
  request_in_progress: { status: 409, title: 'A request with this Idempotency-Key is still in progress' },
  idempotency_key_reused: { status: 422, title: 'This Idempotency-Key was used for a different request' },
  response_not_replayable: { status: 409, title: 'The response for this Idempotency-Key was too large to store' },
  outcome_unknown: { status: 502, title: 'The outcome of the request with this Idempotency-Key is unknown' },
  key_not_releasable: { status: 409, title: 'Only an unknown outcome can be released' },
  upstream_unreachable: { status: 502, title: 'The upstream could not be reached' },
  upstream_timeout: { status: 504, title: 'The upstream did not answer in time' },
  upstream_tls_failed: { status: 502, title: 'The TLS handshake with the upstream failed; nothing was sent' },
  store_unavailable: { status: 503, title: 'The store is unavailable; nothing was forwarded' },
  store_not_replicated: { status: 503, title: 'No synchronous standby confirms the store\'s commits; nothing was forwarded' },
  store_identity_changed: { status: 503, title: 'The store is another cluster than the one this gateway started on; nothing was forwarded' },
  store_lost_commits: { status: 503, title: 'The store failed over and lost commits this gateway acknowledged; nothing was forwarded' },
  unknown_job_type: { status: 400, title: 'No such job type is configured' },
  job_not_found: { status: 404, title: 'No such job' },
  job_finished: { status: 409, title: 'The job has finished' },
  job_not_running: { status: 409, title: 'The job is not running: it has no lease to end' },
  job_not_retryable: { status: 409, title: 'Only a failed or cancelled job can be retried' },
  too_many_waiting_claims: { status: 429, title: 'This tenant has as many claims waiting as the gateway holds' },
  lease_lost: { status: 409, title: 'The lease is no longer held by this owner and fence' },
  not_owner: { status: 409, title: 'Only the live owner of the job may finish it' },
  sequence_conflict: { status: 409, title: 'This chunk does not continue the job output' },
  lease_expired: { status: 409, title: 'The job lease behind this fence has expired' },
  invalid_query: { status: 400, title: 'A query parameter is invalid' },
  entity_frozen: { status: 423, title: 'An operator has frozen this entity' },
  entity_busy: { status: 409, title: 'Another command for this entity is still being delivered' },
  invalid_rule: { status: 422, title: 'The rule is invalid' },
  rules_version_conflict: { status: 412, title: 'The rules have changed since the version given in If-Match' },
  host_not_allowed: { status: 421, title: 'This gateway does not serve the host the request names' },
  cross_site_request: { status: 403, title: 'A request from a page of another site is refused without auth' },
  unsupported_media_type: { status: 415, title: 'The body is not in a media type, charset or encoding read here' },
  unreadable_body: { status: 400, title: 'The body cannot be read the one way an upstream would read it' },
  not_found: { status: 404, title: 'Not found' },
  internal_error: { status: 500, title: 'Internal error' },
} as const satisfies Record<string, { status: number; title: string }>

/** A stable machine-readable error code, e.g. `stale_fence`. */
export type ProblemCode = keyof typeof problemCatalog

/** Extension members a problem may carry next to the RFC 9457 ones. */
export type ProblemExtras = Record<string, string | number | boolean | null | string[]>

/**
 * The one error base of fencegate. Throw it anywhere in a request; the app's
 * `onError` turns it into `application/problem+json`.
 *
 * @example
 * throw new FencegateError('invalid_fence', 'X-Execution-Fence must be a decimal integer')
 */
export class FencegateError extends Error {
  readonly code: ProblemCode
  readonly status: number
  readonly detail: string
  readonly extras: ProblemExtras
  readonly headers: Record<string, string>

  constructor(code: ProblemCode, detail?: string, extras: ProblemExtras = {}, headers: Record<string, string> = {}) {
    super(detail ?? problemCatalog[code].title)
    this.name = 'FencegateError'
    this.code = code
    this.status = problemCatalog[code].status
    this.detail = detail ?? problemCatalog[code].title
    this.extras = extras
    this.headers = headers
  }
}

/**
 * Headers that mark a problem transient: retry after `ms`, rounded up to whole seconds, at least 1.
 *
 * @example
 * throw new FencegateError('entity_busy', detail, {}, retryAfter(1500)) // Retry-After: 2
 */
export function retryAfter(ms: number): Record<string, string> {
  return { 'retry-after': String(Math.max(1, Math.ceil(ms / 1000))) }
}

/**
 * The one shape of a store failure: `503 store_unavailable` with `Retry-After: 1`, since the
 * store being down or out of connections is transient and the request changed nothing.
 * `detail` says what did not happen; it never carries the driver's message.
 *
 * @example
 * if (err instanceof StoreError) throw storeUnavailable('the store could not be read')
 */
export function storeUnavailable(detail: string): FencegateError {
  return new FencegateError('store_unavailable', detail, {}, retryAfter(1000))
}

/** The durability refusals of the store (src/store/durability.ts), by their shape. */
export interface DurabilityRefusalLike {
  code: 'store_not_replicated' | 'store_identity_changed' | 'store_lost_commits'
  detail: string
}

/**
 * A durability refusal as a problem: `store_not_replicated` passes when a standby streams
 * again (`Retry-After: 1`); a changed identity or lost commits last until the gateway restarts,
 * so a retry here cannot help (another gateway may serve it).
 *
 * @example
 * if (err instanceof DurabilityRefusal) throw durabilityProblem(err)
 */
export function durabilityProblem(refusal: DurabilityRefusalLike): FencegateError {
  return new FencegateError(refusal.code, refusal.detail, {}, refusal.code === 'store_not_replicated' ? retryAfter(1000) : {})
}

/**
 * The `error.type` of the envelope that Stripe, OpenAI and many other APIs
 * answer with. Stripe's SDKs read it: `idempotency_error` is about the key,
 * `api_error` is the server's side (every 5xx), `invalid_request_error` is
 * anything else the client sent. See docs/http-contract.md for the mapping.
 */
export type ClientErrorType = 'idempotency_error' | 'invalid_request_error' | 'api_error'

const idempotencyCodes: ReadonlySet<ProblemCode> = new Set(['request_in_progress', 'idempotency_key_reused', 'response_not_replayable', 'key_not_releasable'])

/** @example clientErrorType('idempotency_key_reused') // 'idempotency_error' */
export function clientErrorType(code: ProblemCode): ClientErrorType {
  if (problemCatalog[code].status >= 500) return 'api_error'
  return idempotencyCodes.has(code) ? 'idempotency_error' : 'invalid_request_error'
}

/** The `error` member: what SDKs that key on `{ error: { type, code, message } }` raise from. */
export interface ClientErrorEnvelope {
  type: ClientErrorType
  code: ProblemCode
  message: string
  request_id?: string
}

/**
 * The JSON body of a problem response (RFC 9457), with the route's error envelope beside its
 * members: Stripe's `error` by default, or Square's, Adyen's or Resend's (src/http/envelopes.ts).
 */
export interface ProblemBody {
  type: string
  title: string
  status: number
  detail: string
  code: ProblemCode
  request_id?: string
  error?: ClientErrorEnvelope
  [extra: string]: unknown
}

/**
 * How to render a problem for one request: the route's envelope and the client's `Accept`, or,
 * on an MCP route, a JSON-RPC error answer to the message's `id` (src/http/jsonrpc.ts).
 */
export interface ProblemRendering {
  envelope?: ErrorEnvelope
  accept?: string | null
  /** The message's id: a known one is answered `200` (the refusal is the message's answer); `null` with the problem's status. */
  jsonrpc?: {
    id: RpcId
    /** A `tools/call` on a route with `mcp_refusals: tool_error`: refusals the model can act on are tool results; `resultType` on 2026-07-28 and later. */
    toolError?: { resultType: boolean }
  }
}

/**
 * Builds the problem+json body for an error, in `envelope` (default `stripe`).
 *
 * @example
 * problemBody(new FencegateError('stale_fence'), 'rid', 'adyen').errorCode // 'stale_fence'
 */
export function problemBody(err: FencegateError, requestId?: string, envelope: ErrorEnvelope = 'stripe'): ProblemBody {
  const body: ProblemBody = {
    ...err.extras,
    type: `urn:fencegate:problem:${err.code}`,
    title: problemCatalog[err.code].title,
    status: err.status,
    detail: err.detail,
    code: err.code,
    ...(requestId ? { request_id: requestId } : {}),
  }
  const input = { code: err.code, status: err.status, detail: err.detail, stripeType: clientErrorType(err.code), ...(requestId ? { requestId } : {}) }
  return Object.assign(body, envelopeMembers(envelope, input))
}

/** Renders any thrown value as a problem Response without leaking internal messages. */
export function problemResponse(err: unknown, requestId?: string, how: ProblemRendering = {}): Response {
  return toResponse(problemAnswer(err, requestId, how))
}

/**
 * The same problem as a plain answer, for a runtime that writes answers itself (Node's data
 * plane): `application/problem+json`, or `application/json` for a client that asks for that
 * and not for problem+json (`problemMediaType`); unknown errors become a bare `internal_error`.
 *
 * @example
 * problemAnswer(err, requestId, { envelope: route.error_envelope, accept: request.headers.get('accept') })
 */
export function problemAnswer(err: unknown, requestId?: string, how: ProblemRendering = {}): Answer {
  const problem = err instanceof FencegateError ? err : new FencegateError('internal_error')
  const headers = new HeaderList(Object.entries(problem.headers))
  if (requestId) headers.set('x-request-id', requestId)
  if (how.jsonrpc) return rpcProblemAnswer(problem, requestId, how.jsonrpc, headers)
  headers.set('content-type', problemMediaType(how.accept))
  return { status: problem.status, headers, body: new TextEncoder().encode(JSON.stringify(problemBody(problem, requestId, how.envelope))) }
}

/**
 * A problem as a JSON-RPC error answer, as both MCP SDK lines read one: `200` when it answers a
 * message's id (the SDK rejects that call with the error, its `data` the problem's members), the
 * problem's status when the id could not be read (as the SDKs' own servers answer a parse error).
 */
function rpcProblemAnswer(problem: FencegateError, requestId: string | undefined, how: NonNullable<ProblemRendering['jsonrpc']>, headers: HeaderList): Answer {
  const { id, toolError } = how
  headers.set('content-type', 'application/json')
  const { error: _stripe, ...members } = problemBody(problem, requestId)
  const p = { code: problem.code, detail: problem.detail, members }
  // A message that is not one well-formed call stays a protocol error: no tool ran or could.
  const asTool = toolError !== undefined && id !== null && rpcErrorCode(problem.code) !== invalidRequestCode
  const body = asTool ? rpcToolErrorBody(id, p, toolError.resultType) : rpcErrorBody(id, p)
  return { status: id === null ? problem.status : 200, headers, body: new TextEncoder().encode(body) }
}
