import type { HeaderView } from './exchange.js'
import { limitBody, readBody } from './body.js'

/** A request body as it is passed upstream: bytes, a Web stream, or (on Node) the socket's chunks. */
export type BodySource = Uint8Array | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array> | null

/** A body on its way upstream; `exceeded()` tells, once it broke, whether the size limit broke it. */
export interface PassedBody {
  body: BodySource
  exceeded: () => boolean
}

/**
 * The request as the data plane reads it. A Web `Request` becomes one with `webInbound`;
 * Node's data plane builds one straight from `IncomingMessage` (src/runtime/node/inbound.ts),
 * so a request on Node never becomes a Web `Request`.
 *
 * @example
 * const answer = await handle(webInbound(request), requestIdOf(request))
 */
export interface Inbound {
  method: string
  url: URL
  headers: HeaderView
  /** The whole body, refused with `body_too_large` past `limit` bytes. */
  readBody(limit: number): Promise<Uint8Array>
  /** The body to pass through, failing once more than `limit` bytes went by. */
  passBody(limit: number): Promise<PassedBody>
  /** Aborted when the client goes away before its answer is written (a waiting claim stops waiting). */
  readonly signal: AbortSignal
}

/**
 * A Web `Request` as an Inbound, for fetch-based runtimes and `app.request()`.
 *
 * @example
 * const inbound = webInbound(new Request('http://gateway/payments/42/capture', { method: 'POST' }))
 */
export function webInbound(request: Request): Inbound {
  return {
    method: request.method,
    url: new URL(request.url),
    headers: request.headers,
    readBody: (limit) => readBody(request, limit),
    passBody: (limit) => limitBody(request, limit),
    get signal() {
      return request.signal
    },
  }
}
