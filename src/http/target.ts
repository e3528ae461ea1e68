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
  // Encoded per character (`%25%32%65` is `%2e` once decoded, `.` twice): decode each segment
  // until it stops changing, and check every form it takes on the way.
  else if (path.includes('%') && path.split('/').some(encodesUnsafely)) reason = 'a path segment decodes, once or more, to a dot segment, a slash, a backslash, a semicolon or a NUL byte'
  if (!reason) return undefined
  return new FencegateError('invalid_request', reason)
}

/** Whether a segment, decoded until stable (at most a few times), ever reads as `.`, `..` or holds `/ \\ ;` or NUL. */
function encodesUnsafely(segment: string): boolean {
  let s = segment
  for (let round = 0; round < 4 && s.includes('%'); round++) {
    let decoded: string
    try {
      decoded = decodeURIComponent(s)
    } catch {
      // Not valid percent-encoding as a whole: an upstream may decode the valid parts; refuse.
      return /%[0-9a-f]{2}/i.test(s) && round > 0
    }
    if (decoded === s) return false
    if (/^\.{1,2}$|[/\\;\u0000]/.test(decoded)) return true
    s = decoded
  }
  return s.includes('%') && /%[0-9a-f]{2}/i.test(s)
}
