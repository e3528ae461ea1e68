import type { Answer, HeaderFields, HeaderView } from '../http/exchange.js'
import { HeaderList } from '../http/header-list.js'
import type { BodySource } from '../http/inbound.js'
import { attestationHeader } from './attest.js'
import type { RouteConfig } from '../config/schema.js'

/** What the pipeline hands to a Forward: the destination is always the route's upstream. */
export interface ForwardRequest {
  route: RouteConfig
  /** Path and query to request from the route's upstream origin, e.g. `/payments/42/capture?x=1`. */
  target: string
  method: string
  headers: HeaderFields
  body: BodySource
}

/**
 * Sends one request upstream and resolves with the upstream's answer once its headers
 * arrive: a body the Forward read whole comes as bytes (the pipeline stores and sends them
 * as they are), any other streams. A plain `Answer`, not a Web `Response`: on Node, making
 * a `Response` around the bytes built a Web stream for them, about a tenth of a fenced
 * command's CPU. Implementations: undici on Node (`src/runtime/node/forward.ts`), fetch
 * elsewhere. Failures throw ForwardError.
 *
 * @example
 * const forward: Forward = async () => ({ status: 200, headers: new Headers(), body: new TextEncoder().encode('ok') })
 */
export type Forward = (request: ForwardRequest) => Promise<Answer>

/**
 * Why forwarding failed. `sent` tells whether the upstream may have received
 * the request: a refused connection or a failed TLS handshake was not sent, a timeout or
 * reset may have been.
 */
export class ForwardError extends Error {
  override name = 'ForwardError'
  constructor(readonly kind: 'unreachable' | 'tls' | 'timeout' | 'reset', readonly sent: boolean) {
    super(`upstream ${kind}`)
  }
}

// RFC 9110 §7.6.1 connection-specific fields, plus the ones a proxy must set itself.
const hopByHop = new Set([
  'connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'proxy-connection',
  'te', 'trailer', 'transfer-encoding', 'upgrade', 'host', 'content-length',
  // The gateway answers 100-continue itself (Node does); undici refuses to send it on.
  'expect',
  // Only the gateway says whether an answer is a replay: never pass one through either way.
  'idempotent-replayed',
])

/**
 * Headers with which frameworks let a request say it is another method or another path
 * (Symfony, Laravel, Express's method-override, IIS): the route matched the method and path
 * the gateway saw, so the upstream must not execute a different one.
 */
export const rewritingHeaders = ['x-http-method-override', 'x-http-method', 'x-method-override', 'x-original-url', 'x-rewrite-url'] as const

function withoutHopByHop(source: HeaderView): HeaderList {
  const listed = new Set((source.get('connection') ?? '').split(',').map((h) => h.trim().toLowerCase()).filter(Boolean))
  const out = new HeaderList()
  source.forEach((value, name) => {
    if (!hopByHop.has(name) && !listed.has(name)) out.append(name, value)
  })
  return out
}

/** Headers to send upstream: the client's minus hop-by-hop ones (the Forward sets length and host). */
export function upstreamRequestHeaders(inbound: HeaderView): HeaderList {
  const out = withoutHopByHop(inbound)
  // Only the gateway attests that a fence check passed: a client's own would be a forgery.
  out.delete(attestationHeader)
  for (const name of rewritingHeaders) out.delete(name)
  return out
}

/** Headers to return to the client: the upstream's minus hop-by-hop ones, keeping its Content-Length. */
export function clientResponseHeaders(upstream: HeaderFields): HeaderList {
  const out = withoutHopByHop(upstream)
  const length = upstream.get('content-length')
  if (length !== null) out.set('content-length', length)
  return out
}
