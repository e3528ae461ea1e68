/**
 * The plain shapes a request and an answer take between the data plane's decisions and
 * the runtime that moves the bytes. Web `Headers` fits `HeaderView`; Node's data plane
 * reads the socket's header lines into one without building a Web `Request`.
 */

/** Read access to request headers: names are matched case-insensitively, repeated fields joined with ", ". */
export interface HeaderView {
  get(name: string): string | null
  forEach(each: (value: string, name: string) => void): void
}

/**
 * An answer as the data plane decides it: each runtime writes it its own way (Node to its
 * `ServerResponse`, fetch runtimes as a `Response`, see `toResponse`).
 *
 * @example
 * const answer: Answer = { status: 200, headers: new Headers({ 'content-type': 'application/json' }), body: bytes }
 */
export interface Answer {
  status: number
  headers: Headers
  body: Uint8Array | ReadableStream<Uint8Array> | null
}

/**
 * The answer as a Web `Response`, for fetch-based runtimes and Hono.
 *
 * @example
 * return toResponse({ status: 204, headers: new Headers(), body: null })
 */
export function toResponse(answer: Answer): Response {
  return new Response(answer.body as BodyInit | null, { status: answer.status, headers: answer.headers })
}
