import type { IncomingMessage, ServerResponse } from 'node:http'
import { Transform } from 'node:stream'
import { checkedLength, concatBytes, tooLarge, wholeRequestLimit } from '../../http/body.js'
import type { HeaderView } from '../../http/exchange.js'
import type { Inbound, PassedBody } from '../../http/inbound.js'

/**
 * The request as Node delivered it, read in one pass over its header lines: no Web
 * `Request`, `Headers` or stream is made. Names are lower-cased and repeated fields joined
 * with ", ", as Web `Headers` does (Node's own `headers` object keeps only the first of
 * some, such as a second `Authorization`, which must stay ambiguous rather than pick one).
 *
 * @example
 * const headers = headerViewOf(incoming.rawHeaders)
 * headers.get('x-execution-fence') // '7'
 */
export function headerViewOf(rawHeaders: string[]): HeaderView {
  const fields = new Map<string, string>()
  // Kept apart because "A-1, A-1" joined reads as one value to the gateway and as "A-1" to an
  // upstream that takes the first line: a header a route reads must arrive once.
  let repeated: Set<string> | undefined
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase()
    const prior = fields.get(name)
    if (prior !== undefined) (repeated ??= new Set()).add(name)
    fields.set(name, prior === undefined ? rawHeaders[i + 1]! : `${prior}, ${rawHeaders[i + 1]!}`)
  }
  return {
    get: (name) => fields.get(name.toLowerCase()) ?? null,
    forEach: (each) => fields.forEach(each),
    repeated: (name) => repeated?.has(name.toLowerCase()) ?? false,
  }
}

/**
 * An Inbound over Node's `IncomingMessage`. The raw target has passed `unsafeTarget`, so it
 * is origin-form; the host is not read (the upstream gets its own).
 *
 * @example
 * const answer = await handle(nodeInbound(incoming, headerViewOf(incoming.rawHeaders), res), requestId)
 */
export function nodeInbound(incoming: IncomingMessage, headers: HeaderView, res: ServerResponse): Inbound {
  let gone: AbortSignal | undefined
  return {
    method: incoming.method ?? 'GET',
    url: new URL(`http://gateway${incoming.url ?? '/'}`),
    headers,
    readBody: (limit) => readWhole(incoming, headers, limit),
    passBody: (limit) => passOn(incoming, headers, limit),
    // Made only when asked for (a waiting claim): most requests never need one.
    get signal() {
      return (gone ??= goneSignal(res))
    },
  }
}

/** Aborted when the response closes before it was written in full: the client went away. */
function goneSignal(res: ServerResponse): AbortSignal {
  const controller = new AbortController()
  const check = () => {
    if (!res.writableFinished) controller.abort(new Error('the client closed the connection before its answer'))
  }
  if (res.closed) check()
  else res.once('close', check)
  return controller.signal
}

/** Reads the body into memory; past `limit` it stops reading (the socket stays open for the 413). */
function readWhole(incoming: IncomingMessage, headers: HeaderView, limit: number): Promise<Uint8Array> {
  checkedLength(headers.get('content-length'), limit)
  return new Promise((resolve, reject) => {
    const chunks: Uint8Array[] = []
    let size = 0
    const done = (settle: () => void) => {
      incoming.off('data', onData).off('end', onEnd).off('close', onClose)
      settle()
    }
    const onData = (chunk: Buffer) => {
      size += chunk.byteLength
      if (size > limit) {
        incoming.pause()
        done(() => reject(tooLarge(limit)))
      } else chunks.push(chunk)
    }
    const onEnd = () => done(() => resolve(concatBytes(chunks, size)))
    // 'close' before 'end': the client went away in the middle of its body.
    const onClose = () => done(() => reject(new Error('the client closed the connection before the body ended')))
    incoming.on('data', onData).once('end', onEnd).once('close', onClose)
  })
}

/**
 * A body to pass through: read whole when small and of declared length (sent upstream as
 * bytes, as in `limitBody`), else the socket's own stream through a counter that fails it
 * past `limit`. `pipe` never destroys its source, so a body over the limit leaves the
 * connection able to carry the 413.
 */
async function passOn(incoming: IncomingMessage, headers: HeaderView, limit: number): Promise<PassedBody> {
  const declared = checkedLength(headers.get('content-length'), limit)
  if (declared !== undefined && declared <= wholeRequestLimit) return { body: await readWhole(incoming, headers, limit), exceeded: () => false }
  if (declared === undefined && headers.get('transfer-encoding') === null) return { body: null, exceeded: () => false }
  let size = 0
  let over = false
  const counted = new Transform({
    transform(chunk: Buffer, _encoding, callback) {
      size += chunk.byteLength
      if (size <= limit) return callback(null, chunk)
      over = true
      callback(tooLarge(limit))
    },
  })
  incoming.once('close', () => {
    if (!incoming.readableEnded) counted.destroy(new Error('the client closed the connection before the body ended'))
  })
  incoming.pipe(counted)
  return { body: counted, exceeded: () => over }
}
