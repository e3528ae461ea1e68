import type { HeaderFields, HeaderView } from '../http/exchange.js'
import type { RouteConfig } from '../config/schema.js'
import { defaultKeyTemplate } from '../config/templates.js'
import { idempotencyHeader, parseIdempotencyKey } from './idempotency.js'

/**
 * Headers fencegate adds to answers of keyed routes so that SDKs find what
 * they read: the request's own `Idempotency-Key` (Stripe's SDK exposes it as
 * `lastResponse.idempotencyKey`), and the route's retry hint on a replay.
 */

/**
 * Echoes a well-formed `Idempotency-Key`, exactly as the client sent it, on a
 * route that reads keys; a malformed one is not repeated back.
 *
 * @example echoIdempotencyKey(response.headers, request, route.config)
 */
export function echoIdempotencyKey(target: HeaderFields | Record<string, string>, request: { headers: HeaderView }, route: RouteConfig): void {
  // Only where the key is that header: a key read from elsewhere has none to echo.
  if (route.idempotency === 'off' || route.idempotency_key.toLowerCase() !== defaultKeyTemplate.toLowerCase()) return
  const sent = request.headers.get(idempotencyHeader)
  try {
    if (parseIdempotencyKey(sent) === undefined) return
  } catch {
    return
  }
  if (isFields(target)) target.set(idempotencyHeader, sent!)
  else target[idempotencyHeader] = sent!
}

/** A replay is final: asking again gets the same answer, so the retry hint (unless stored) says false. */
export function hintReplay(headers: HeaderFields, route: RouteConfig): void {
  if (route.retry_hint_header && !headers.has(route.retry_hint_header)) headers.set(route.retry_hint_header, 'false')
}

function isFields(target: HeaderFields | Record<string, string>): target is HeaderFields {
  return typeof target.set === 'function'
}
