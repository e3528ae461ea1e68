import type { HeaderView } from './exchange.js'
import { isFormBody, parseFormBody } from './form-body.js'
import { FencegateError } from './problems.js'

/**
 * Refuses a request that asks the upstream to take it for another method than the one its
 * route matched through `_method` in the query (Laravel reads it there). Rails' and Laravel's
 * `_method` form field is refused where the gateway holds the body (`refuseFormMethodOverride`);
 * the override headers (`X-HTTP-Method-Override`, …) are removed on the way (src/gateway/forward.ts).
 * A route fences `POST /payments/:id/capture`; the upstream must not run a `DELETE` the gateway
 * never routed.
 *
 * @example refuseMethodOverride(new URL('http://gw/p?_method=DELETE')) // throws invalid_request
 */
export function refuseMethodOverride(url: URL): void {
  // Only a query that could spell it is parsed.
  if (/_method|%5f/i.test(url.search) && [...url.searchParams.keys()].includes('_method')) throw overridden('the query parameter _method')
}

/**
 * Refuses a form body naming `_method` (Rack's MethodOverride, Laravel), on a route that holds
 * the body's bytes. Only a body that could spell it is parsed.
 *
 * @example refuseFormMethodOverride(new Headers({ 'content-type': 'application/x-www-form-urlencoded' }), bytes('_method=DELETE')) // throws
 */
export function refuseFormMethodOverride(headers: HeaderView, bytes: Uint8Array): void {
  if (!isFormBody(headers.get('content-type'))) return
  const text = new TextDecoder('latin1').decode(bytes)
  if (/_method|%5f/i.test(text) && Object.hasOwn(parseFormBody(text), '_method')) throw overridden('the form field _method')
}

function overridden(what: string): FencegateError {
  return new FencegateError('invalid_request', `${what} asks the upstream to take the request for another HTTP method than the one its route matched`)
}
