import type { HeaderView } from './exchange.js'
import { isFormBody, parseFormBody } from './form-body.js'
import { FencegateError } from './problems.js'

/**
 * Headers with which common frameworks let a request stand for another method (Express's
 * method-override, Symfony and Laravel with overrides enabled, many Java filters).
 */
const overrideHeaders = ['x-http-method-override', 'x-http-method', 'x-method-override']

/**
 * Refuses a request that asks the upstream to take it for another method than the one its
 * route matched: an override header, or `_method` in the query (Laravel reads it there).
 * Rails' and Laravel's `_method` form field is refused where the gateway holds the body
 * (`refuseFormMethodOverride`). A route fences `POST /payments/:id/capture`; the upstream
 * must not run a `DELETE` the gateway never routed.
 *
 * @example refuseMethodOverride(new Headers({ 'x-http-method-override': 'DELETE' }), new URL('http://gw/p')) // throws invalid_request
 */
export function refuseMethodOverride(headers: HeaderView, url: URL): void {
  for (const name of overrideHeaders) {
    if (headers.get(name) !== null) throw overridden(`header ${name}`)
  }
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
