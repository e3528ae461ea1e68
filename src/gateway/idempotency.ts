import type { Answer, HeaderView } from '../http/exchange.js'
import { HeaderList } from '../http/header-list.js'
import { concatBytes, sha256Hex, type Digest } from '../http/body.js'
import { FencegateError } from '../http/problems.js'
import type { StoredResponse } from '../store/store.js'

/** The request header that names one logical operation. */
export const idempotencyHeader = 'idempotency-key'
/** The response header set on every replayed answer (and never passed through from elsewhere). */
export const replayedHeader = 'idempotent-replayed'
/** The longest key fencegate accepts. */
export const maxKeyLength = 255

/**
 * Parses `Idempotency-Key`: an RFC 9651 sf-string (`"abc"`, with `\"` and `\\`
 * escapes) or a bare token of 1–255 visible ASCII characters, as Stripe's
 * clients send. Two headers arrive joined by a comma and are refused, as are
 * lists, empty and over-long keys. `null` means the header is absent.
 *
 * @example parseIdempotencyKey('"order-42"') // 'order-42'
 * @example parseIdempotencyKey('order-42') // 'order-42'
 */
export function parseIdempotencyKey(value: string | null, header = 'Idempotency-Key'): string | undefined {
  if (value === null) return undefined
  const invalid = (why: string) => new FencegateError('invalid_idempotency_key', `${header} ${why}`)
  let key: string
  if (value.startsWith('"')) {
    const m = /^"((?:[\x20\x21\x23-\x5B\x5D-\x7E]|\\["\\])*)"$/.exec(value)
    if (!m) throw invalid('must be one sf-string ("...") or one bare token')
    key = m[1]!.replace(/\\(["\\])/g, '$1')
  } else {
    if (!/^[\x21-\x7E]*$/.test(value) || value.includes(',')) throw invalid('must be one sf-string ("...") or one bare token of visible ASCII characters')
    key = value
  }
  if (key.length === 0) throw invalid('is empty')
  if (key.length > maxKeyLength) throw invalid(`is longer than ${maxKeyLength} characters`)
  return key
}

/**
 * A key as one header value, the form `parseIdempotencyKey` reads back to it: a bare token
 * when it is one, else an sf-string. The key header is forwarded in this form, so that the
 * two spellings of one key the gateway accepts are one key to the upstream as well.
 *
 * @example keyHeaderValue('order-42') // 'order-42'
 * @example keyHeaderValue('order 42') // '"order 42"'
 */
export function keyHeaderValue(key: string): string {
  return /^[\x21\x23-\x2B\x2D-\x7E][\x21-\x2B\x2D-\x7E]*$/.test(key) ? key : `"${key.replace(/["\\]/g, '\\$&')}"`
}

/**
 * The payload's identity: SHA-256 over method, route name, path, query and the
 * SHA-256 of the raw body bytes, taken before anything transforms the request.
 * The body's hash is the one already recorded for the command, so the body is
 * hashed once. The fence is not part of it, so a new owner retrying the same
 * operation gets the replay. Path and query cannot contain a newline, route
 * names cannot either, and the body's hash is 64 hex digits, so the input is
 * unambiguous.
 *
 * @example
 * await payloadFingerprint('POST', 'capture', '/payments/42/capture', '', await sha256Hex(body))
 */
export async function payloadFingerprint(method: string, route: string, path: string, query: string, bodySha256: string, digest: Digest = sha256Hex, headerEntity?: string): Promise<string> {
  // An entity read from a header is in none of the other parts: without it, the same key and
  // body with another entity header replayed the other entity's answer. It is appended only
  // on such routes, so every other route's fingerprints stay as they were.
  const entity = headerEntity === undefined ? '' : `\n${headerEntity}`
  return digest(new TextEncoder().encode(`${method}\n${route}\n${path}\n${query}\n${bodySha256}${entity}`))
}

/**
 * The fingerprint of an `idempotency_payload: key` route, where the key alone names the
 * operation: method and route, and the entity when the route has one (an answer about
 * one entity is never replayed for another), but neither path, query nor body. It starts
 * with `key`, so it never equals a request fingerprint's input.
 *
 * @example await keyFingerprint('POST', 'reports', 'report:sales:2026-08')
 */
export async function keyFingerprint(method: string, route: string, entity: string | undefined, digest: Digest = sha256Hex): Promise<string> {
  return digest(new TextEncoder().encode(`key\n${method}\n${route}${entity === undefined ? '' : `\n${entity}`}`))
}

/**
 * The same fingerprint from the raw body bytes, for callers that have not hashed the body yet.
 *
 * @example
 * await fingerprint('POST', 'capture', '/payments/42/capture', '', new TextEncoder().encode('{}'))
 */
export async function fingerprint(method: string, route: string, path: string, query: string, body: Uint8Array, digest: Digest = sha256Hex): Promise<string> {
  return payloadFingerprint(method, route, path, query, await digest(body), digest)
}

// Only these describe the result itself; Set-Cookie, Date, hop-by-hop and rate-limit headers never replay.
const replayableHeaders = ['content-type', 'location', 'content-location', 'etag', 'last-modified', 'link']

/** The allow-listed headers of an upstream response, plus a route's `replay_headers`, as stored for replay. */
export function storedHeaders(headers: HeaderView, extra: readonly string[] = []): [string, string][] {
  return [...replayableHeaders, ...extra.filter((name) => !replayableHeaders.includes(name))].flatMap((name) => {
    const value = headers.get(name)
    return value === null ? [] : [[name, value] as [string, string]]
  })
}

/** Rebuilds a stored response, byte for byte, marked as a replay. */
export function replayAnswer(stored: StoredResponse, requestId: string): Answer {
  const headers = new HeaderList(stored.headers)
  headers.set(replayedHeader, 'true')
  headers.set('x-request-id', requestId)
  const empty = stored.status === 204 || stored.status === 304
  return { status: stored.status, headers, body: empty ? null : stored.body }
}

/** How a captured response ended. */
export type Captured =
  | { kind: 'complete'; body: Uint8Array }
  | { kind: 'too_large' }
  | { kind: 'broken' }

/**
 * Streams an upstream body to the client while keeping a copy of up to
 * `limit` bytes. The stream closes only after `settle` (which stores the
 * outcome) resolves; the pipeline drops Content-Length from such responses, so
 * a client cannot consider the answer complete before its record is durable,
 * and a duplicate sent right after it gets the replay. If the client goes
 * away the copy keeps reading, so the record is settled all the same.
 */
export function captureBody(body: ReadableStream<Uint8Array> | null, limit: number, settle: (captured: Captured) => Promise<void>): ReadableStream<Uint8Array> {
  const copy = new BodyCopy(body?.getReader(), limit, settle)
  let clientGone = false
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const chunk = await copy.step()
      if (clientGone) return
      if (chunk) controller.enqueue(chunk)
      else controller.close()
    },
    cancel() {
      clientGone = true
      void copy.drain()
    },
  }, { highWaterMark: 0 })
}

/** The upstream body's reads and the copy kept of it, up to `limit` bytes; the outcome is settled once. */
class BodyCopy {
  private readonly chunks: Uint8Array[] = []
  private size = 0
  private settled: Promise<void> | undefined
  // One read at a time: a cancel can arrive while a pull is still reading.
  private busy: Promise<unknown> = Promise.resolve()

  constructor(
    private readonly reader: ReadableStreamDefaultReader<Uint8Array> | undefined,
    private readonly limit: number,
    private readonly settle: (captured: Captured) => Promise<void>,
  ) {}

  /** The next chunk, once the reads before it are done; undefined once the body ended and the outcome is settled. */
  step(): Promise<Uint8Array | undefined> {
    const next = this.busy.catch(() => {}).then(() => this.readOnce())
    this.busy = next
    return next
  }

  // Once the client is gone, read the rest so the record still settles; past the limit nothing is kept.
  async drain(): Promise<void> {
    try {
      while (!this.settled) {
        if (this.size > this.limit) {
          await this.busy.catch(() => {})
          await this.reader?.cancel()
          await this.finish({ kind: 'too_large' })
          return
        }
        await this.step()
      }
    } catch {
      // settled as broken by readOnce
    }
  }

  private finish(captured: Captured): Promise<void> {
    return (this.settled ??= this.settle(captured))
  }

  private async readOnce(): Promise<Uint8Array | undefined> {
    if (this.settled) return undefined
    if (!this.reader) {
      await this.finish({ kind: 'complete', body: new Uint8Array(0) })
      return undefined
    }
    let next
    try {
      next = await this.reader.read()
    } catch (err) {
      await this.finish({ kind: 'broken' })
      throw err
    }
    if (next.done) {
      await this.finish(this.size <= this.limit ? { kind: 'complete', body: concatBytes(this.chunks, this.size) } : { kind: 'too_large' })
      return undefined
    }
    this.size += next.value.byteLength
    if (this.size <= this.limit) this.chunks.push(next.value)
    else this.chunks.length = 0
    return next.value
  }
}
