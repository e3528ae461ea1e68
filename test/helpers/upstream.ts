import { createServer, type IncomingMessage, type RequestListener, type ServerResponse } from 'node:http'
import { createServer as createHttpsServer, type ServerOptions as HttpsOptions } from 'node:https'
import type { AddressInfo, Socket } from 'node:net'

export interface ReceivedRequest {
  method: string
  path: string
  headers: IncomingMessage['headers']
  rawHeaders: string[]
  body: Buffer
}

export type UpstreamHandler = (req: ReceivedRequest, res: ServerResponse) => void | Promise<void>

export interface TestUpstream {
  url: string
  port: number
  /** Every request that reached the upstream, in arrival order. */
  received: ReceivedRequest[]
  handle(handler: UpstreamHandler): void
  /** Resolves once `count` requests in all have arrived. */
  arrived(count: number): Promise<void>
  close(): Promise<void>
}

const echo: UpstreamHandler = (req, res) => {
  res.writeHead(200, { 'content-type': 'application/json' })
  res.end(JSON.stringify({ method: req.method, path: req.path, fence: req.headers['x-execution-fence'] ?? null }))
}

/** A real HTTP server on loopback that records what the gateway sent it; with `tls`, an HTTPS one. */
export async function startUpstream(handler: UpstreamHandler = echo, options: { tls?: HttpsOptions } = {}): Promise<TestUpstream> {
  const received: ReceivedRequest[] = []
  const waiters: { count: number; resolve: () => void }[] = []
  let current = handler
  const sockets = new Set<Socket>()
  const listener: RequestListener = (req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const r: ReceivedRequest = { method: req.method!, path: req.url!, headers: req.headers, rawHeaders: req.rawHeaders, body: Buffer.concat(chunks) }
      received.push(r)
      for (const w of waiters.filter((w) => received.length >= w.count)) w.resolve()
      void current(r, res)
    })
  }
  const server = options.tls ? createHttpsServer(options.tls, listener) : createServer(listener)
  server.on('connection', (s) => {
    sockets.add(s)
    s.on('close', () => sockets.delete(s))
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  return {
    url: `${options.tls ? 'https' : 'http'}://127.0.0.1:${port}`,
    port,
    received,
    handle(h) {
      current = h
    },
    arrived(count) {
      if (received.length >= count) return Promise.resolve()
      return new Promise((resolve) => waiters.push({ count, resolve }))
    },
    close: () => new Promise((resolve) => {
      for (const s of sockets) s.destroy()
      server.close(() => resolve())
    }),
  }
}

/**
 * The oracle of "each key executes once": an upstream that counts the requests of each
 * `Idempotency-Key` in `executions` and answers 200 with the key and fence it got.
 */
export async function startKeyCountingUpstream(): Promise<TestUpstream & { executions: Map<string, number> }> {
  const executions = new Map<string, number>()
  const upstream = await startUpstream((req, res) => {
    const key = String(req.headers['idempotency-key'])
    executions.set(key, (executions.get(key) ?? 0) + 1)
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ key, fence: req.headers['x-execution-fence'] }))
  })
  return Object.assign(upstream, { executions })
}

/** A port on loopback that nothing listens on (bound, then released). */
export async function closedPort(): Promise<number> {
  const server = createServer()
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  await new Promise((resolve) => server.close(resolve))
  return port
}

/** A latch a test opens when it is ready: upstream handlers await `opened` to hold their answer. */
export function gate(): { opened: Promise<void>; open: () => void } {
  let open!: () => void
  const opened = new Promise<void>((resolve) => (open = resolve))
  return { opened, open }
}

/**
 * Resolves when a response that refused a write can take more (`drain`) or is gone
 * (`close`), whichever comes first, and removes both listeners: leaving one behind per
 * wait made Node warn about a listener leak after ten.
 */
export function drainedOrClosed(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done)
      res.off('close', done)
      resolve()
    }
    res.once('drain', done)
    res.once('close', done)
  })
}
