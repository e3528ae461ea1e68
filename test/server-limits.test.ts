import { mkdtempSync } from 'node:fs'
import { connect, type AddressInfo, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { silentLogger } from '../src/observe/log.js'
import { listen, startGateway, type RunningGateway } from '../src/runtime/node/gateway.js'
import { route, testConfig } from './helpers/gateway.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * The security review: neither plane bounded how long a client may take over its headers or
 * its request (Node's sweep held a slow-header connection 60 to 75 s), nor how many
 * connections the server or one peer may hold. Replayed with raw sockets against both planes
 * of a gateway started as `fencegate serve` starts it. Every wait is on a socket's state (its
 * answer, its close), never on the clock.
 */

/** A raw connection from `localAddress` (Linux routes all of 127.0.0.0/8 to loopback). */
function open(url: string, localAddress = '127.0.0.1'): Promise<Socket> {
  const { hostname, port } = new URL(url)
  return new Promise((resolve, reject) => {
    const socket = connect({ host: hostname, port: Number(port), localAddress })
    socket.once('connect', () => resolve(socket)).once('error', reject)
  })
}

/** Everything the server sent until it closed the connection. */
function untilClosed(socket: Socket): Promise<string> {
  let received = ''
  socket.on('data', (chunk: Buffer) => { received += chunk.toString('latin1') })
  // A connection refused past a cap may be reset: that is a close too.
  socket.on('error', () => {})
  return new Promise((resolve) => socket.once('close', () => resolve(received)))
}

/** Sends a GET on a kept-alive connection and resolves with the status of its (complete) answer. */
function get(socket: Socket, url: string, path: string): Promise<number> {
  return new Promise((resolve, reject) => {
    let received = ''
    const onData = (chunk: Buffer) => {
      received += chunk.toString('latin1')
      const end = received.indexOf('\r\n\r\n')
      if (end < 0) return
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(received.slice(0, end))?.[1] ?? 0)
      if (received.length - end - 4 < length) return
      socket.off('data', onData).off('close', onClose)
      resolve(Number(received.slice(9, 12)))
    }
    const onClose = () => reject(new Error(`closed before its answer: ${JSON.stringify(received)}`))
    socket.on('data', onData).once('close', onClose)
    socket.write(`GET ${path} HTTP/1.1\r\nHost: ${new URL(url).host}\r\n\r\n`)
  })
}

describe('server limits on both planes', () => {
  let upstream: TestUpstream
  let gw: RunningGateway

  beforeAll(async () => {
    upstream = await startUpstream()
    const config = testConfig([route(upstream.url)], {
      server: {
        port: 0, admin_port: 0,
        headers_timeout: '300ms', request_timeout: '600ms', lingering_time: '500ms',
        max_connections: 3, max_connections_per_peer: 2,
      },
      store: { data_dir: mkdtempSync(join(tmpdir(), 'fencegate-limits-')) },
    })
    gw = await startGateway({ config, log: silentLogger })
  })
  afterAll(async () => {
    await gw?.close(1000)
    await upstream?.close()
  })

  const planes = () => [['data', gw.dataUrl, '/no-such-route'], ['admin', gw.adminUrl, '/health']] as const

  // Node's own default held such a connection for 60 s or more: the test's 15 s timeout fails on it.
  it('closes a connection whose headers never end after headers_timeout, with a 408', { timeout: 15_000 }, async () => {
    for (const [plane, url] of planes()) {
      const socket = await open(url)
      const closed = untilClosed(socket)
      socket.write(`POST /payments/1/capture HTTP/1.1\r\nHost: ${new URL(url).host}\r\nX-Execution-Fence: 1\r\n`)
      expect([plane, (await closed).split('\r\n')[0]]).toEqual([plane, 'HTTP/1.1 408 Request Timeout'])
    }
  })

  it('closes a connection whose body never ends after request_timeout', { timeout: 15_000 }, async () => {
    const socket = await open(gw.dataUrl)
    const closed = untilClosed(socket)
    socket.write(`POST /payments/1/capture HTTP/1.1\r\nHost: ${new URL(gw.dataUrl).host}\r\nX-Execution-Fence: 1\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{`)
    await closed
    expect(socket.destroyed).toBe(true)
    expect(upstream.received).toHaveLength(0)
  })

  // Without the caps nothing closes the excess connections: the 15 s timeout fails the test rather than hanging it.
  it('closes one peer\'s connection past max_connections_per_peer, another peer\'s past max_connections, while the first ones still work', { timeout: 15_000 }, async () => {
    for (const [plane, url, path] of planes()) {
      const first = await open(url)
      const second = await open(url)
      // An answer on each: the server has counted both before the next one connects.
      expect([plane, await get(first, url, path), await get(second, url, path)]).toEqual([plane, expect.any(Number), expect.any(Number)])
      const third = await open(url)
      expect([plane, 'per peer', await untilClosed(third)]).toEqual([plane, 'per peer', ''])
      const otherPeer = await open(url, '127.0.0.2')
      expect(await get(otherPeer, url, path)).toBe(await get(first, url, path))
      const overTotal = await open(url, '127.0.0.3')
      expect([plane, 'in all', await untilClosed(overTotal)]).toEqual([plane, 'in all', ''])
      // Still served, on the same connections.
      expect(await get(second, url, path)).toBe(await get(first, url, path))
      await Promise.all([first, second, otherPeer].map((s) => { const closed = untilClosed(s); s.end(); return closed }))
    }
  })
})

describe('the per-peer count', () => {
  it('lets a peer connect again once the server has seen its connections close', { timeout: 15_000 }, async () => {
    const limits = testConfig([route('http://127.0.0.1:9')], { server: { max_connections_per_peer: 1 } }).server
    const server = await listen((_req, res) => res.end('ok'), '127.0.0.1', 0, limits)
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    // Registered after listen's own listener, so its socket's 'close' runs after the count's.
    const gone: Promise<void>[] = []
    server.on('connection', (s: Socket) => gone.push(new Promise((resolve) => s.once('close', () => resolve()))))
    try {
      const first = await open(url)
      expect(await get(first, url, '/')).toBe(200)
      expect(await untilClosed(await open(url))).toBe('')
      first.end()
      await gone[0]
      const again = await open(url)
      expect(await get(again, url, '/')).toBe(200)
      again.destroy()
    } finally {
      server.closeAllConnections()
      await new Promise((resolve) => server.close(resolve))
    }
  })
})
