import type { RouteConfig } from '../config/schema.js'
import { retryAfter, type FencegateError } from '../http/problems.js'

/**
 * Whether a retry can help, said the same way on every refusal: a transient
 * problem carries `Retry-After` (seconds, at least 1), a permanent one none.
 * A route may also state it in a vendor header (`retry_hint_header`, e.g.
 * `Stripe-Should-Retry`) as `true` or `false`, for SDKs that ignore
 * `Retry-After` and retry every 409 and 5xx unless told not to.
 */

/** True when the problem says a retry can help (it carries `Retry-After`). */
export function isTransient(problem: FencegateError): boolean {
  return problem.headers['retry-after'] !== undefined
}

/**
 * When a duplicate should come back for a key whose original is in flight:
 * when the original's own timeout ends (it answers or becomes an unknown
 * outcome by then), counted from its age, never later than its lock.
 *
 * @example inProgressRetryMs({ ageMs: 4000, lockLeftMs: 28_000 }, 5000) // 1000
 */
export function inProgressRetryMs(inFlight: { ageMs: number; lockLeftMs: number }, timeoutMs: number): number {
  return Math.min(Math.max(0, timeoutMs - inFlight.ageMs), inFlight.lockLeftMs)
}

/**
 * A forward that failed: retrying is safe when nothing reached the upstream,
 * or when it may have but the upstream de-duplicates the key it was sent with.
 * Otherwise a retry could execute the operation twice, so none is suggested.
 */
export function forwardFailureRetry(o: { sent: boolean; keyed: boolean; upstreamDedupesKeys: boolean }): Record<string, string> {
  return !o.sent || (o.keyed && o.upstreamDedupesKeys) ? retryAfter(1000) : {}
}

/** Adds the route's vendor retry header (`true`/`false`) to a problem answered on that route. */
export function withRetryHint(problem: FencegateError, route: RouteConfig | undefined): FencegateError {
  if (route?.retry_hint_header) problem.headers[route.retry_hint_header.toLowerCase()] = String(isTransient(problem))
  return problem
}
