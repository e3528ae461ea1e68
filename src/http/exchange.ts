/**
 * The plain shapes a request and an answer take between the data plane's decisions and
 * the runtime that moves the bytes. Web `Headers` fits `HeaderView`; Node's data plane
 * reads the socket's header lines into one without building a Web `Request`.
 */

/** Read access to request headers: names are matched case-insensitively, repeated fields joined with ", ". */
export interface HeaderView {
  get(name: string): string | null
  forEach(each: (value: string, name: string) => void): void
  /**
   * True when the field arrived more than once. Only a runtime that sees the header lines can
   * tell (Node's); Web `Headers` has already joined them, so there it is absent.
   */
  repeated?(name: string): boolean
}

/**
 * Header fields an answer carries and the data plane edits: Web `Headers` fits, and so does
 * `HeaderList`, the plain list the data plane builds per command.
 */
export interface HeaderFields extends HeaderView {
  has(name: string): boolean
  set(name: string, value: string): void
  append(name: string, value: string): void
  delete(name: string): void
  /** Every `Set-Cookie` field apart: they cannot be joined with ", " like the others. */
  getSetCookie(): string[]
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
  headers: HeaderFields
  body: Uint8Array | ReadableStream<Uint8Array> | null
}

/**
 * The answer as a Web `Response`, for fetch-based runtimes and Hono.
 *
 * @example
 * return toResponse({ status: 204, headers: new Headers(), body: null })
 */
export function toResponse(answer: Answer): Response {
  return new Response(answer.body as BodyInit | null, { status: answer.status, headers: webHeaders(answer.headers) })
}

/**
 * The fields as new Web `Headers`, `Set-Cookie` kept apart: a copy the caller may edit
 * (the fetch forward adds its own fields to it).
 *
 * @example
 * await fetch(url, { headers: webHeaders(answer.headers) })
 */
export function webHeaders(fields: HeaderFields): Headers {
  if (fields instanceof Headers) return new Headers(fields)
  const out = new Headers()
  fields.forEach((value, name) => {
    if (name !== 'set-cookie') out.append(name, value)
  })
  for (const cookie of fields.getSetCookie()) out.append('set-cookie', cookie)
  return out
}
