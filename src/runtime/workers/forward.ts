import { ForwardError, type Forward, type ForwardRequest } from '../../gateway/forward.js'
import { webHeaders } from '../../http/exchange.js'

export interface FetchForwardOptions {
  /** The fetch to send with; defaults to the runtime's global `fetch`. */
  fetch?: typeof fetch
}

/*
 * What standard fetch lets a Forward tell apart, honestly:
 * - Our own timer firing is certain: 'timeout', and the request may have gone.
 * - Node (undici) puts the socket error in `cause.code`. The codes below fail
 *   before a byte is written (refused, DNS, no route, or a header undici
 *   rejects), so they are 'unreachable' with nothing sent.
 * - Every other failure, and every failure on Workers (whose fetch errors carry
 *   no code), is 'reset' with sent: true. A refused connection on Workers thus
 *   counts as possibly sent: the idempotency key becomes an unknown outcome
 *   rather than being freed, which is the safe side of not knowing.
 * - A timeout that fired while still connecting is also reported as sent.
 */
const notSent = new Set([
  'ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_NOT_SUPPORTED', 'UND_ERR_INVALID_ARG',
])

/*
 * Standard fetch decodes a compressed response body and keeps the upstream's
 * Content-Encoding and Content-Length, which then describe bytes the body no
 * longer holds. So the upstream is only offered gzip (which every fetch
 * decodes), and when a response arrives in codings fetch decodes, both headers
 * are dropped: the client gets the decoded body, uncompressed. Bodies in any
 * other coding (an upstream that ignored Accept-Encoding) pass untouched.
 * Node 20's fetch decodes gzip, x-gzip, deflate and br; Node 26's also zstd, which
 * this forward (made for workerd) does not list, so a zstd body from an upstream that
 * ignored Accept-Encoding arrives decoded under its zstd header when run on Node 26.
 */
const offered = 'gzip'
const decodedCodings = new Set(['gzip', 'x-gzip', 'deflate', 'br'])

/**
 * A Forward on the standard `fetch`, for runtimes without undici pools
 * (Cloudflare Workers). Redirects are returned, never followed; `timeout_ms`
 * bounds the wait for the response headers and each wait for a body chunk.
 *
 * @example
 * const app = createApp({ config, store, forward: createFetchForward() })
 */
export function createFetchForward(options: FetchForwardOptions = {}): Forward {
  // Called as a plain function: Workers throws "Illegal invocation" for fetch called on another `this`.
  const send = options.fetch ?? ((input: RequestInfo | URL, init?: RequestInit) => fetch(input, init))

  return async ({ route, target, method, headers, body: given }) => {
    const { outgoing, body } = outgoingRequest(method, headers, given)
    const abort = new AbortController()
    const res = await sendTimed(send, route.upstream.origin + route.upstream.basePath + target, {
      method,
      headers: outgoing,
      body: body as BodyInit | null,
      redirect: 'manual',
      signal: abort.signal,
      // Node's fetch requires it for a streamed body; Workers ignores it.
      ...(body instanceof ReadableStream ? { duplex: 'half' } : {}),
    } as RequestInit, abort, route.timeout_ms)
    const responseHeaders = new Headers(res.headers)
    const encoding = responseHeaders.get('content-encoding')
    if (res.body !== null && encoding !== null && isDecoded(encoding)) {
      responseHeaders.delete('content-encoding')
      responseHeaders.delete('content-length')
    }
    if (res.body === null) return { status: res.status, headers: responseHeaders, body: null }
    return { status: res.status, headers: responseHeaders, body: timedBody(res.body, abort, route.timeout_ms) }
  }
}

/** The headers and body fetch can send: only gzip offered, and never a body with GET or HEAD. */
function outgoingRequest(method: string, headers: ForwardRequest['headers'], given: ForwardRequest['body']): { outgoing: Headers; body: Uint8Array | ReadableStream<Uint8Array> | null } {
  // Web inbounds pass bytes or a Web stream; an async iterable of chunks is Node's alone.
  if (given !== null && !(given instanceof Uint8Array) && !(given instanceof ReadableStream)) throw new TypeError('the fetch forward sends bytes or a ReadableStream')
  let body: Uint8Array | ReadableStream<Uint8Array> | null = given
  const outgoing = webHeaders(headers)
  outgoing.set('accept-encoding', offered)
  // The gateway's own server already answered any 100-continue; undici's fetch refuses the header.
  outgoing.delete('expect')
  if ((method === 'GET' || method === 'HEAD') && body !== null) {
    // fetch cannot send a body with GET or HEAD; refusing is better than silently dropping it.
    if (body instanceof ReadableStream || body.byteLength > 0) throw new ForwardError('unreachable', false)
    body = null
  }
  return { outgoing, body }
}

/** Sends with our own timer on the wait for the response headers; a failure is classified (see `notSent`). */
async function sendTimed(send: typeof fetch, url: string, init: RequestInit, abort: AbortController, timeoutMs: number): Promise<Response> {
  const timer = setTimeout(() => abort.abort(), timeoutMs)
  try {
    return await send(url, init)
  } catch (err) {
    throw classify(err, abort.signal.aborted)
  } finally {
    clearTimeout(timer)
  }
}

/** undici's bodyTimeout, by hand: a body that stalls for `timeoutMs` fails instead of hanging. */
function timedBody(body: ReadableStream<Uint8Array>, abort: AbortController, timeoutMs: number): ReadableStream<Uint8Array> {
  const chunks = body.getReader()
  let timer: ReturnType<typeof setTimeout> | undefined
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      timer = setTimeout(() => abort.abort(), timeoutMs)
      try {
        const { value, done } = await chunks.read()
        if (done) controller.close()
        else controller.enqueue(value)
      } catch (err) {
        controller.error(err)
      } finally {
        clearTimeout(timer)
      }
    },
    async cancel(reason) {
      clearTimeout(timer)
      await chunks.cancel(reason).catch(() => {})
    },
  }, { highWaterMark: 0 })
}

function isDecoded(contentEncoding: string): boolean {
  const codings = contentEncoding.split(',').map((c) => c.trim().toLowerCase()).filter(Boolean)
  return codings.length > 0 && codings.every((c) => decodedCodings.has(c))
}

function classify(err: unknown, timedOut: boolean): ForwardError {
  if (timedOut) return new ForwardError('timeout', true)
  const cause = (err as { cause?: { code?: unknown; errors?: { code?: unknown }[] } } | null)?.cause
  // Node's happy-eyeballs connect reports one error per address tried in an AggregateError.
  const codes = [cause?.code, ...(cause?.errors ?? []).map((e) => e?.code)].filter((c): c is string => typeof c === 'string')
  if (codes.length > 0 && codes.every((c) => notSent.has(c))) return new ForwardError('unreachable', false)
  return new ForwardError('reset', true)
}
