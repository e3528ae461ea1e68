import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'

/** A fetch-style handler, as the 2.x SDK's `createMcpHandler` returns. */
export interface FetchHandler {
  fetch(request: Request): Promise<Response>
}

/** A request's body, whole. */
export async function readBody(req: IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = []
  for await (const chunk of req) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks)
}

/**
 * Answers a `node:http` request with what a fetch-style handler answers, its body streamed as
 * it comes (an event stream's events one by one). The request's body was read by the caller
 * (`body`), so it can look at the message first. With `cancelOnClose`, the client leaving is the
 * handler's cancellation (the request's signal), as the SDK's own Node adapter passes it on.
 *
 * @example
 * createServer(async (req, res) => answerWith(handler, req, res, await readBody(req)))
 */
export async function answerWith(handler: FetchHandler, req: IncomingMessage, res: ServerResponse, body: Buffer | undefined, cancelOnClose = false): Promise<void> {
  const headers = new Headers()
  for (const [name, value] of Object.entries(req.headers)) if (typeof value === 'string') headers.set(name, value)
  const gone = new AbortController()
  if (cancelOnClose) res.on('close', () => gone.abort())
  const request = new Request(`http://127.0.0.1${req.url}`, { method: req.method!, headers, signal: gone.signal, ...(body && body.length > 0 ? { body: new Uint8Array(body) } : {}) })
  const answer = await handler.fetch(request)
  res.writeHead(answer.status, Object.fromEntries(answer.headers))
  try {
    if (answer.body) for await (const chunk of answer.body as unknown as AsyncIterable<Uint8Array>) res.write(chunk)
  } catch (err) {
    // A stream that ended because its request was cancelled is what the cancelling tests want.
    if (!gone.signal.aborted) throw err
  }
  res.end()
}

/**
 * A `node:http` server on a free loopback port, whose `close()` ends every connection (a
 * gateway's kept-alive ones included) and then `alsoClose` (the MCP handlers).
 *
 * @example
 * const server = await listenOnLoopback(async (req, res) => answerWith(handler, req, res, await readBody(req)), () => handler.close())
 */
export async function listenOnLoopback(listener: (req: IncomingMessage, res: ServerResponse) => Promise<void>, alsoClose: () => Promise<void> = async () => {}): Promise<{ url: string; close(): Promise<void> }> {
  const http = createServer((req, res) => {
    listener(req, res).catch((err: unknown) => res.destroy(err as Error))
  })
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${(http.address() as AddressInfo).port}`,
    async close() {
      await alsoClose()
      await new Promise<void>((resolve) => {
        http.close(() => resolve())
        http.closeAllConnections()
      })
    },
  }
}
