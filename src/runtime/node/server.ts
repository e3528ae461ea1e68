import { createServer, type RequestListener, type Server } from 'node:http'
import type { AddressInfo, Socket } from 'node:net'
import type { Config } from '../../config/schema.js'

/** What a plane's node:http server is bounded by: `server.*` of the configuration. */
export type ServerLimits = Pick<Config['server'], 'max_header_bytes' | 'headers_timeout' | 'request_timeout' | 'max_connections' | 'max_connections_per_peer'>

/**
 * How often Node sweeps its connections for an expired `headersTimeout` or `requestTimeout`.
 * Node checks them only on this sweep (30 s by default), so a 60 s header timeout held a
 * slow-header connection for 60 to 90 s: a quarter of the header timeout, at most 1 s, keeps
 * the overshoot small while a sweep of even thousands of connections stays cheap.
 */
export function connectionsCheckingInterval(limits: Pick<ServerLimits, 'headers_timeout'>): number {
  return Math.max(25, Math.min(1000, Math.floor(limits.headers_timeout / 4)))
}

/**
 * Closes a peer's connections past `cap` as they arrive, counting each remote address's open
 * sockets: one client cannot take every slot of `maxConnections` and lock the others out.
 * Node refuses past `maxConnections` before 'connection' is emitted, so those are never counted.
 */
function capPerPeer(server: Server, cap: number): void {
  const open = new Map<string, number>()
  server.on('connection', (socket: Socket) => {
    const peer = socket.remoteAddress
    // Gone before it was seen (no address): nothing to serve.
    if (peer === undefined) return void socket.destroy()
    const count = open.get(peer) ?? 0
    if (count >= cap) return void socket.destroy()
    open.set(peer, count + 1)
    socket.once('close', () => {
      const left = open.get(peer)! - 1
      if (left === 0) open.delete(peer)
      else open.set(peer, left)
    })
  })
}

/**
 * Serves a request listener on Node with the configured bounds: header size, the time a
 * client may take to send its headers and its whole request, and how many connections the
 * server, and any one peer, may hold. The data and the admin plane (and each worker of
 * `server.workers`: every process bounds its own) are served by this.
 *
 * @example
 * const server = await listen(dataPlaneListener(plane, log), '127.0.0.1', 0, config.server)
 */
export function listen(listener: RequestListener, hostname: string, port: number, limits: ServerLimits): Promise<Server> {
  return new Promise((resolve, reject) => {
    const server = createServer({
      maxHeaderSize: limits.max_header_bytes,
      headersTimeout: limits.headers_timeout,
      requestTimeout: limits.request_timeout,
      connectionsCheckingInterval: connectionsCheckingInterval(limits),
    }, listener)
    server.maxConnections = limits.max_connections
    capPerPeer(server, limits.max_connections_per_peer)
    server.once('error', reject)
    server.listen(port, hostname, () => resolve(server))
  })
}

/** The URL a listening server is reached at, by the host it was asked to listen on. */
export function urlOf(server: Server, host: string): string {
  const { port } = server.address() as AddressInfo
  return `http://${host.includes(':') ? `[${host}]` : host}:${port}`
}

/**
 * Stops accepting, closes idle connections, and waits up to `graceMs` for in-flight requests
 * before cutting what is left.
 */
export function stop(server: Server, graceMs: number): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      if ('closeAllConnections' in server) server.closeAllConnections()
    }, graceMs)
    server.close(() => {
      clearTimeout(timer)
      resolve()
    })
    if ('closeIdleConnections' in server) server.closeIdleConnections()
  })
}
