import type { errorEnvelopes } from '../config/fields.js'

/** How a route's refusals name their error for its clients' SDK: `stripe` (the default), `square`, `adyen` or `resend`. */
export type ErrorEnvelope = (typeof errorEnvelopes)[number]

/** What an envelope is built from: the problem's own members, nothing else. */
export interface EnvelopeInput {
  code: string
  status: number
  detail: string
  /** Stripe's `error.type` for the code (`clientErrorType` in problems.ts). */
  stripeType: string
  requestId?: string
}

/**
 * The members an envelope adds beside problem+json's `type`, `title`, `status`, `detail` and
 * `code`, each as the SDK reads it (docs/http-contract.md#error-envelopes):
 * - `stripe`: `error: {type, code, message, request_id}`; `stripe` raises from `error`.
 * - `square`: `errors: [{category, code, detail}]`; `square`'s `SquareError.errors` is that list
 *   (without it, it builds one from `type` and `message`, which a problem does not carry).
 *   `code` is the problem's code in Square's upper case (`STALE_FENCE`; `IDEMPOTENCY_KEY_REUSED`
 *   is Square's own name for that refusal too).
 * - `adyen`: `errorCode`, `message`, `errorType`; `@adyen/api-library` raises an
 *   `HttpClientException` from a body with `status`, whose `errorCode` and message come from these.
 * - `resend`: `name`, `message`, `statusCode`; `resend` returns the parsed body as its `error`.
 *
 * @example
 * envelopeMembers('resend', { code: 'stale_fence', status: 409, detail: 'fence 3 < 5', stripeType: 'invalid_request_error' })
 * // { name: 'stale_fence', message: 'fence 3 < 5', statusCode: 409 }
 */
export function envelopeMembers(envelope: ErrorEnvelope, p: EnvelopeInput): Record<string, unknown> {
  switch (envelope) {
    case 'square':
      return { errors: [{ category: squareCategory(p.status), code: p.code.toUpperCase(), detail: p.detail }] }
    case 'adyen':
      return { errorCode: p.code, message: p.detail, errorType: adyenErrorType(p.status) }
    case 'resend':
      return { name: p.code, message: p.detail, statusCode: p.status }
    case 'stripe':
      return { error: { type: p.stripeType, code: p.code, message: p.detail, ...(p.requestId ? { request_id: p.requestId } : {}) } }
  }
}

/** Square's ErrorCategory by status: its API returns AUTHENTICATION_ERROR for 401 and 403, API_ERROR for 5xx. */
export function squareCategory(status: number): string {
  if (status >= 500) return 'API_ERROR'
  if (status === 401 || status === 403) return 'AUTHENTICATION_ERROR'
  if (status === 429) return 'RATE_LIMIT_ERROR'
  return 'INVALID_REQUEST_ERROR'
}

/** Adyen's errorType by status: `security` for 401/403, `internal` for 5xx, else `validation`. */
export function adyenErrorType(status: number): string {
  if (status >= 500) return 'internal'
  if (status === 401 || status === 403) return 'security'
  return 'validation'
}

/**
 * The media type to answer a problem as: `application/json` when `Accept` names
 * `application/json` and does not name `application/problem+json` at least as high, else
 * `application/problem+json`. Wildcards (`*\/*`, `application/*`) name neither: a client that
 * sends only those takes anything, and gets problem+json. node-zendesk, for one, sends
 * `Accept: application/json` and reads a body only when its type contains `application/json`.
 *
 * @example
 * problemMediaType('application/json') // 'application/json'
 * problemMediaType('application/problem+json, application/json;q=0.9') // 'application/problem+json'
 */
export function problemMediaType(accept: string | null | undefined): 'application/json' | 'application/problem+json' {
  if (!accept) return 'application/problem+json'
  let json = 0
  let problem = 0
  for (const range of accept.split(',')) {
    const [type = '', ...params] = range.split(';').map((s) => s.trim().toLowerCase())
    const q = qualityOf(params)
    if (type === 'application/json') json = Math.max(json, q)
    else if (type === 'application/problem+json') problem = Math.max(problem, q)
  }
  return json > 0 && json > problem ? 'application/json' : 'application/problem+json'
}

function qualityOf(params: string[]): number {
  const q = params.find((p) => p.startsWith('q='))
  if (q === undefined) return 1
  const value = Number(q.slice(2))
  return Number.isFinite(value) && value >= 0 && value <= 1 ? value : 0
}
