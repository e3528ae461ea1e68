import type { HeaderView } from './exchange.js'
import { FencegateError } from './problems.js'

/**
 * Keeps web pages away from planes that authenticate nobody.
 *
 * Without `auth`, whoever reaches a plane may do anything on it, and that is meant to be
 * only the host's own processes: the planes listen on loopback. A browser on that host is
 * such a process too, and it runs any page's code: a page could POST to
 * `http://127.0.0.1:8081/entities/invoice%3A7/bump` as `text/plain` (no CORS preflight), or
 * rebind its own DNS name to 127.0.0.1 and then read and write the plane as its own origin.
 * So, without auth, a request is refused when:
 * - its `Host` names no allowed host (loopback, the address the plane listens on,
 *   `server.allowed_hosts`): a DNS-rebound page sends its own name (`host_not_allowed`);
 * - it says it comes from another site: `Sec-Fetch-Site` other than `same-origin` or `none`,
 *   or an `Origin` that is not this very host and port (`cross_site_request`);
 * - on the admin plane and the job API, which read JSON, it sends a body of any other
 *   `Content-Type` (`unsupported_media_type`): the types a page may send without a preflight
 *   (`text/plain`, forms) are never read as JSON.
 * Clients that are not browsers send no `Origin` and no `Sec-Fetch-Site`, and are unaffected.
 */

export interface BrowserGuard {
  /** Host names (lower case, no port; IPv6 without brackets) a request may name. */
  hosts: ReadonlySet<string>
}

const loopbackNames = ['127.0.0.1', '::1', 'localhost']

/**
 * The guard for a plane listening on `listenHost`, with the operator's extra names.
 *
 * @example
 * const guard = browserGuard('127.0.0.1', config.server.allowed_hosts)
 */
export function browserGuard(listenHost: string, allowed: readonly string[] = []): BrowserGuard {
  const wildcard = listenHost === '0.0.0.0' || listenHost === '::'
  return { hosts: new Set([...loopbackNames, ...(wildcard ? [] : [listenHost.toLowerCase()]), ...allowed.map((h) => h.toLowerCase())]) }
}

/** The host name of a `Host` header value or an origin's authority: no port, no IPv6 brackets. */
function hostName(authority: string): string {
  const bracketed = /^\[([^\]]+)\](?::\d+)?$/.exec(authority)
  if (bracketed) return bracketed[1]!.toLowerCase()
  return authority.replace(/:\d+$/, '').toLowerCase()
}

/**
 * Why a request must be refused by the guard, or undefined. `readsJson`: the endpoint reads
 * its body as JSON (the admin plane, the job API), so a body of another type is refused.
 *
 * @example
 * const refusal = browserRefusal(request.headers, request.method, guard, false)
 * if (refusal) throw refusal
 */
export function browserRefusal(headers: HeaderView, method: string, guard: BrowserGuard, readsJson: boolean): FencegateError | undefined {
  const host = headers.get('host')
  if (host === null || !guard.hosts.has(hostName(host))) {
    return new FencegateError('host_not_allowed', 'without auth this plane serves only requests for loopback or a host named in server.allowed_hosts')
  }
  const site = headers.get('sec-fetch-site')
  if (site !== null && site !== 'same-origin' && site !== 'none') {
    return new FencegateError('cross_site_request', `without auth this plane refuses requests a page of another site made (Sec-Fetch-Site: ${site.slice(0, 20)})`)
  }
  const origin = headers.get('origin')
  if (origin !== null && !sameOrigin(origin, host)) {
    return new FencegateError('cross_site_request', 'without auth this plane refuses requests whose Origin is not this host')
  }
  const type = headers.get('content-type')
  // A declared type must be JSON; an undeclared one is refused only when a body is announced.
  if (readsJson && !['GET', 'HEAD', 'OPTIONS'].includes(method) && (type !== null ? !isJson(type) : hasBody(headers))) {
    return new FencegateError('unsupported_media_type', 'this endpoint reads a JSON body: send it as Content-Type: application/json')
  }
  return undefined
}

function sameOrigin(origin: string, host: string): boolean {
  try {
    const url = new URL(origin)
    return (url.protocol === 'http:' || url.protocol === 'https:') && url.host.toLowerCase() === host.toLowerCase()
  } catch {
    // `null` (a sandboxed frame, a file) or garbage: not this host.
    return false
  }
}

function hasBody(headers: HeaderView): boolean {
  const length = headers.get('content-length')
  return headers.get('transfer-encoding') !== null || (length !== null && length.trim() !== '0')
}

/** `application/json` or a `+json` type, parameters allowed. */
export function isJson(contentType: string | null): boolean {
  if (contentType === null) return false
  const type = contentType.split(';')[0]!.trim().toLowerCase()
  return type === 'application/json' || /^application\/[a-z0-9.+-]+\+json$/.test(type)
}
