import { FencegateError } from './problems.js'

/**
 * Refuses request targets that only make sense as an attack on a proxy:
 * absolute-form (`POST http://evil.example/...`) or `*`, dot segments
 * (`/a/../b`, also percent-encoded), backslashes and encoded slashes, path parameters
 * (`;`) and double encodings, which an upstream might decode or normalise into a path the
 * gateway never matched (Tomcat, Spring, nginx and Express differ here). A pure function of
 * the target string, so each runtime applies it to what it has: Node to the raw target it
 * received (src/runtime/node/target.ts), a Worker to its already parsed URL, whose dot
 * segments the URL parser has resolved but whose `;` and encodings it keeps
 * (src/runtime/workers/app.ts).
 *
 * @example unsafeTarget('/payments/..;/capture') // FencegateError invalid_request
 */
export function unsafeTarget(rawTarget: string | undefined): FencegateError | undefined {
  if (rawTarget === undefined) return undefined
  const query = rawTarget.indexOf('?')
  const path = query === -1 ? rawTarget : rawTarget.slice(0, query)
  let reason: string | undefined
  if (!rawTarget.startsWith('/')) reason = 'only origin-form request targets (/path?query) are accepted'
  else if (/\\|%2f|%5c/i.test(path)) reason = 'backslashes and encoded slashes are not accepted in paths'
  // Tomcat and Spring drop `;params` from segments (`/payments/..;/capture` is `/capture`
  // there, `/payments/42;x/capture` is invoice 42), so the gateway would fence one path and
  // the upstream serve another.
  else if (/;|%3b/i.test(path)) reason = 'path parameters (;) are not accepted in paths'
  // Decoded twice by some upstreams: %252e is a dot there, %2500 a NUL.
  else if (/%25(2e|2f|5c|3b|00)|%00/i.test(path)) reason = 'double-encoded dots, slashes, semicolons and NUL bytes are not accepted in paths'
  // Split only when a segment may start with a dot: nearly every path has none.
  else if (/(^|\/)(\.|%2e)/i.test(path) && path.split('/').some((s) => /^(\.|%2e){1,2}$/i.test(s))) reason = 'dot segments (. and ..) are not accepted in paths'
  if (!reason) return undefined
  return new FencegateError('invalid_request', reason)
}
