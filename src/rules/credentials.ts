import type { Config, RouteConfig } from '../config/schema.js'

/**
 * What a route's file entry entrusts to the upstream: its headers, its client certificate and
 * CA, and whether the caller's own token is passed on. None of it is ever a rule (rules are
 * stored in the database and written by any `fencegate:admin` token); each gateway applies its
 * own file's by route name, and only to the requests the file's entry sends: the same origin,
 * the same method, and an upstream path under the file's.
 */
export interface UpstreamCredentials {
  origin: string
  /** The upstream's base path, as the file gave it. */
  basePath: string
  method: string
  /** The route's path pattern, as the file gave it. */
  path: string
  headers: Record<string, string>
  tls?: RouteConfig['upstream_tls']
  forwardAuthorization: boolean
}

/** The routes' upstream credentials by route name: they stay in the file, never in the database. */
export function credentialsOf(config: Pick<Config, 'routes'>): Map<string, UpstreamCredentials> {
  return new Map(config.routes.filter((r) => Object.keys(r.upstream_headers).length > 0 || r.upstream_tls || r.forward_authorization)
    .map((r) => [r.name, {
      origin: r.upstream.origin, basePath: r.upstream.basePath, method: r.method, path: r.path,
      headers: r.upstream_headers, forwardAuthorization: r.forward_authorization, ...(r.upstream_tls ? { tls: r.upstream_tls } : {}),
    }]))
}

/**
 * A stored route with the file's credentials of its name applied, when its requests stay
 * inside the file entry's (see {@link insideFileRoute}), and with none otherwise. Whatever the
 * stored rule says about `upstream_headers`, `upstream_tls` or `forward_authorization` is
 * dropped: the file is their only source.
 *
 * @example
 * withFileCredentials(storedRoute, credentialsOf(config).get(storedRoute.name))
 */
export function withFileCredentials(route: RouteConfig, own: UpstreamCredentials | undefined): RouteConfig {
  const { upstream_tls: _tls, upstream_headers: _headers, forward_authorization: _forward, ...rest } = route
  if (!own || !insideFileRoute(own, route)) return { ...rest, upstream_headers: {}, forward_authorization: false }
  return { ...rest, upstream_headers: own.headers, forward_authorization: own.forwardAuthorization, ...(own.tls ? { upstream_tls: own.tls } : {}) }
}

/**
 * Whether every request a route sends upstream is one its file entry could send: the file's
 * origin and method, and an upstream path (base path, then the route's path) that starts
 * with the file's, segment by segment, a parameter only where the file has one. So a rule
 * that moves a route to another method, another path or another base path on the file's
 * origin (`/admin/...` where the file said `/payments/...`) is served without the file's
 * credential; one that only narrows it (`/payments/:id/capture/partial`) keeps it. A
 * segment with `%`, or a dot segment, never matches: the upstream could read it as another path.
 *
 * @example
 * insideFileRoute(own, { method: 'POST', path: '/payments/:id/capture', upstream: { origin: own.origin, basePath: own.basePath } }) // true
 */
export function insideFileRoute(own: UpstreamCredentials, route: Pick<RouteConfig, 'method' | 'path' | 'upstream'>): boolean {
  if (route.upstream.origin !== own.origin || route.method !== own.method) return false
  const file = upstreamSegments(own.basePath, own.path)
  const rule = upstreamSegments(route.upstream.basePath, route.path)
  if (rule.length < file.length || rule.some((s) => /%|^literal:\.\.?$/.test(s))) return false
  return file.every((s, i) => s === rule[i])
}

/** The upstream path as segments: the base path's are literals; a route's `:name` is a parameter, whatever its name. */
function upstreamSegments(basePath: string, path: string): string[] {
  const base = basePath.split('/').slice(1).map((s) => `literal:${s}`)
  return [...base, ...path.split('/').slice(1).map((s) => (s.startsWith(':') ? 'param' : `literal:${s}`))]
}
