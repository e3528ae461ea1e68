import type { ServerResponse } from 'node:http'
import type { Answer } from '../../http/exchange.js'

/**
 * Writes an answer to Node's response: head and body in one call when the body is bytes
 * (nearly every answer: small upstream answers, replays, problems), else the stream chunk by
 * chunk with backpressure. A client that leaves cancels the stream; a stream that breaks
 * (an upstream reset mid-body) destroys the response, so the client sees it broken, never
 * complete.
 *
 * @example
 * await writeAnswer({ status: 200, headers: new Headers(), body: new Uint8Array(0) }, res)
 */
export async function writeAnswer(answer: Answer, res: ServerResponse): Promise<void> {
  const head: Record<string, string | string[]> = {}
  answer.headers.forEach((value, name) => {
    head[name] = value
  })
  const cookies = answer.headers.getSetCookie()
  if (cookies.length > 0) head['set-cookie'] = cookies
  const { body } = answer
  // Bytes go out with their length (else Node would chunk them); a null body keeps what the
  // upstream declared (the answer to a HEAD).
  if (body instanceof Uint8Array) head['content-length'] = String(body.byteLength)
  res.writeHead(answer.status, head)
  if (body === null || body instanceof Uint8Array) {
    res.end(body ?? undefined)
    return
  }
  await pump(body, res)
}

async function pump(body: ReadableStream<Uint8Array>, res: ServerResponse): Promise<void> {
  const reader = body.getReader()
  // A client gone before or while the answer streams cancels it: a captured answer then still
  // reads to its end and settles its key (src/gateway/idempotency.ts captureBody).
  const cancel = () => {
    reader.cancel().catch(() => {})
  }
  if (res.destroyed) return cancel()
  const onClose = () => {
    if (!res.writableFinished) cancel()
  }
  res.once('close', onClose)
  try {
    for (;;) {
      const { done, value } = await reader.read()
      if (done) break
      if (res.destroyed) return cancel()
      if (!res.write(value)) await drained(res)
    }
    res.end()
  } catch (err) {
    res.destroy(err as Error)
  } finally {
    res.off('close', onClose)
  }
}

/** Resolves once the response can take more, or is gone ('close' may have come already). */
function drained(res: ServerResponse): Promise<void> {
  if (res.destroyed) return Promise.resolve()
  return new Promise((resolve) => {
    const go = () => {
      res.off('drain', go).off('close', go)
      resolve()
    }
    res.once('drain', go).once('close', go)
  })
}
