import { FencegateError } from './problems.js'

/**
 * Reads a request body into memory, refusing more than `limit` bytes: commands
 * whose fence is checked are buffered because their SHA-256 is recorded before
 * anything is forwarded.
 */
export async function readBody(request: Request, limit: number): Promise<Uint8Array> {
  if (declaredLength(request, limit) !== undefined) {
    // A declared length bounds the body (HTTP framing), so it can be read in one go: on
    // Node that skips building a Web stream for it. A body longer than it claimed (only
    // possible for a Request made in-process) is still refused.
    const bytes = new Uint8Array(await request.arrayBuffer())
    if (bytes.byteLength > limit) throw tooLarge(limit)
    return bytes
  }
  if (!request.body) return new Uint8Array(0)
  const chunks: Uint8Array[] = []
  let size = 0
  const reader = request.body.getReader()
  for (;;) {
    const { done, value } = await reader.read()
    if (done) break
    size += value.byteLength
    if (size > limit) {
      await reader.cancel().catch(() => {})
      throw tooLarge(limit)
    }
    chunks.push(value)
  }
  return concatBytes(chunks, size)
}

/** Joins chunks whose lengths add up to `size` into one array. */
export function concatBytes(chunks: Uint8Array[], size: number): Uint8Array {
  if (chunks.length === 1) return chunks[0]!
  const all = new Uint8Array(size)
  let offset = 0
  for (const c of chunks) {
    all.set(c, offset)
    offset += c.byteLength
  }
  return all
}

/**
 * A passed-through body of declared length up to this size is read whole and sent as
 * bytes, as nginx buffers small request bodies: on Node that skips three Web streams per
 * request (the request's own, the limit's transform, the forward's), about a fifth of a
 * passthrough's CPU (`npm run bench -- profile`).
 */
export const wholeRequestLimit = 64 * 1024

/**
 * Passes a body through, failing it once more than `limit` bytes went by; `exceeded()`
 * tells the pipeline why the upstream request broke. A small body of declared length comes
 * back whole (`wholeRequestLimit`); any other streams.
 */
export async function limitBody(request: Request, limit: number): Promise<{ body: Uint8Array | ReadableStream<Uint8Array> | null; exceeded: () => boolean }> {
  const declared = declaredLength(request, limit)
  if (declared !== undefined && declared <= wholeRequestLimit) {
    const bytes = new Uint8Array(await request.arrayBuffer())
    if (bytes.byteLength > limit) throw tooLarge(limit)
    return { body: bytes, exceeded: () => false }
  }
  let size = 0
  let over = false
  if (!request.body) return { body: null, exceeded: () => false }
  const body = request.body.pipeThrough(new TransformStream<Uint8Array, Uint8Array>({
    transform(chunk, controller) {
      size += chunk.byteLength
      if (size > limit) {
        over = true
        controller.error(tooLarge(limit))
        return
      }
      controller.enqueue(chunk)
    },
  }))
  return { body, exceeded: () => over }
}

/** The declared length, refused when over the limit; undefined when none was declared. */
function declaredLength(request: Request, limit: number): number | undefined {
  return checkedLength(request.headers.get('content-length'), limit)
}

/**
 * A `Content-Length` value as a number, refused with `body_too_large` when over `limit`;
 * undefined when there is none (a chunked body, or none at all).
 *
 * @example checkedLength('32', 1024) // 32
 */
export function checkedLength(declared: string | null | undefined, limit: number): number | undefined {
  if (declared == null || !/^\d+$/.test(declared)) return undefined
  if (Number(declared) > limit) throw tooLarge(limit)
  return Number(declared)
}

/** The `body_too_large` refusal for a body over `limit` bytes. */
export function tooLarge(limit: number): FencegateError {
  return new FencegateError('body_too_large', `the request body exceeds ${limit} bytes`, { limit })
}

/**
 * A SHA-256 function answering in lower-case hex. The core takes one as a
 * dependency: Web Crypto (`sha256Hex`) runs everywhere, but in Node each
 * `crypto.subtle.digest` is a thread-pool job costing ~10x a synchronous
 * `node:crypto` hash, so Node injects that one (src/runtime/node/hash.ts).
 *
 * @example
 * const digest: Digest = sha256Hex
 * await digest(new TextEncoder().encode('abc')) // 'ba7816bf…'
 */
export type Digest = (bytes: Uint8Array) => string | Promise<string>

/**
 * Lower-case hex SHA-256, via Web Crypto so it runs on every runtime.
 *
 * @example
 * await sha256Hex(new Uint8Array(0)) // 'e3b0c442…'
 */
export async function sha256Hex(bytes: Uint8Array): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes as Uint8Array<ArrayBuffer>))
  let hex = ''
  for (const b of digest) hex += b.toString(16).padStart(2, '0')
  return hex
}
