import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http'
import { connect, type AddressInfo } from 'node:net'
import { Readable } from 'node:stream'
import { afterEach, describe, expect, it } from 'vitest'
import { wholeRequestLimit } from '../src/http/body.js'
import { FencegateError } from '../src/http/problems.js'
import { headerViewOf, nodeInbound } from '../src/runtime/node/inbound.js'

// nodeInbound over real sockets: a node:http server whose handler is the test's, and raw
// HTTP/1.1 from a client socket, so chunking, early answers and hang-ups are real.
let server: Server | undefined
afterEach(async () => {
  server?.closeAllConnections()
  await new Promise((resolve) => server?.close(resolve) ?? resolve(undefined))
  server = undefined
})

async function serve(handler: (req: IncomingMessage, res: ServerResponse) => Promise<void>): Promise<number> {
  server = createServer((req, res) => {
    handler(req, res).catch((err: unknown) => {
      res.writeHead(err instanceof FencegateError ? err.status : 500, { 'content-type': 'text/plain' })
      res.end(err instanceof FencegateError ? err.code : String(err))
    })
  })
  await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve))
  return (server.address() as AddressInfo).port
}

/** Sends raw bytes; resolves with everything the server wrote before it closed or `untilText` appeared. */
function raw(port: number, parts: string[], untilText?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(port, '127.0.0.1')
    let got = ''
    socket.on('data', (d) => {
      got += d.toString('latin1')
      if (untilText && got.includes(untilText)) {
        socket.destroy()
        resolve(got)
      }
    })
    socket.on('close', () => resolve(got))
    socket.on('error', reject)
    for (const p of parts) socket.write(p)
  })
}

/** Polls a condition on state, never a fixed sleep. */
async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((resolve) => setImmediate(resolve))
}

const chunked = (...chunks: string[]) => chunks.map((c) => `${c.length.toString(16)}\r\n${c}\r\n`).join('') + '0\r\n\r\n'

describe('headerViewOf: the header lines read once', () => {
  it('matches names case-insensitively and joins repeated fields as Web Headers does, a second Authorization included', () => {
    const view = headerViewOf(['Authorization', 'Bearer a', 'X-Execution-Fence', '7', 'authorization', 'Bearer b'])
    expect(view.get('authorization')).toBe('Bearer a, Bearer b')
    expect(view.get('X-EXECUTION-FENCE')).toBe('7')
    expect(view.get('idempotency-key')).toBeNull()
    const seen: [string, string][] = []
    view.forEach((value, name) => seen.push([name, value]))
    expect(seen).toEqual([['authorization', 'Bearer a, Bearer b'], ['x-execution-fence', '7']])
  })
})

describe('nodeInbound: the body straight off IncomingMessage', () => {
  it('reads a chunked body whole, byte for byte', async () => {
    const port = await serve(async (req, res) => {
      const bytes = await nodeInbound(req, headerViewOf(req.rawHeaders), res).readBody(1024)
      res.end(`got ${Buffer.from(bytes).toString()}`)
    })
    const answer = await raw(port, ['POST /x HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n', chunked('{"a":', '1}')])
    expect(answer).toContain('got {"a":1}')
  })

  it('refuses a chunked body past the limit and can still answer on the connection', async () => {
    const port = await serve(async (req, res) => {
      await nodeInbound(req, headerViewOf(req.rawHeaders), res).readBody(8)
    })
    const answer = await raw(port, ['POST /x HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n', chunked('12345', '67890')], 'body_too_large')
    expect(answer).toMatch(/^HTTP\/1\.1 413/)
  })

  it('refuses a declared length over the limit before reading', async () => {
    const port = await serve(async (req, res) => {
      await nodeInbound(req, headerViewOf(req.rawHeaders), res).readBody(8)
    })
    const answer = await raw(port, ['POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\n'], 'body_too_large')
    expect(answer).toMatch(/^HTTP\/1\.1 413/)
  })

  it('rejects, rather than waits forever, when the client hangs up in the middle of its body', async () => {
    let outcome: Promise<unknown> | undefined
    const reached = new Promise<void>((resolve) => {
      void serve(async (req, res) => {
        outcome = nodeInbound(req, headerViewOf(req.rawHeaders), res).readBody(1024).then(() => 'read', (err: Error) => err.message)
        resolve()
        await outcome
      }).then((port) => {
        const socket = connect(port, '127.0.0.1')
        socket.write('POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\n12345')
        void reached.then(() => socket.destroy())
      })
    })
    await reached
    expect(await outcome).toMatch(/closed the connection/)
  })

  it('passes a small declared body as bytes, and a large one as the socket\'s own stream, counted', async () => {
    const kinds: string[] = []
    const port = await serve(async (req, res) => {
      const passed = await nodeInbound(req, headerViewOf(req.rawHeaders), res).passBody(4 * wholeRequestLimit)
      kinds.push(passed.body instanceof Uint8Array ? 'bytes' : passed.body instanceof Readable ? 'stream' : String(passed.body))
      let size = 0
      if (passed.body instanceof Uint8Array) size = passed.body.byteLength
      else if (passed.body !== null) for await (const chunk of passed.body as AsyncIterable<Uint8Array>) size += chunk.byteLength
      res.end(`size ${size}`)
    })
    const big = 'x'.repeat(wholeRequestLimit + 1)
    expect(await raw(port, [`POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\nconnection: close\r\n\r\nabc`])).toContain('size 3')
    expect(await raw(port, [`POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: ${big.length}\r\nconnection: close\r\n\r\n${big}`])).toContain(`size ${big.length}`)
    expect(await raw(port, ['GET /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n'])).toContain('size 0')
    expect(kinds).toEqual(['bytes', 'stream', 'null'])
  })

  it('fails a streamed body once it passes the limit, and says so', async () => {
    let exceeded: boolean | undefined
    const port = await serve(async (req, res) => {
      const passed = await nodeInbound(req, headerViewOf(req.rawHeaders), res).passBody(8)
      try {
        for await (const chunk of passed.body as AsyncIterable<Uint8Array>) void chunk
      } finally {
        exceeded = passed.exceeded()
      }
    })
    const answer = await raw(port, ['POST /x HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n', chunked('12345', '67890')], 'body_too_large')
    expect(answer).toMatch(/^HTTP\/1\.1 413/)
    expect(exceeded).toBe(true)
  })
})

describe('nodeInbound: the signal a waiting claim listens to', () => {
  it('aborts when the client hangs up before its answer, and not once the answer was written', async () => {
    const signals: AbortSignal[] = []
    const seen: Promise<void>[] = []
    const port = await serve(async (req, res) => {
      const signal = nodeInbound(req, headerViewOf(req.rawHeaders), res).signal
      signals.push(signal)
      if (req.url === '/answered') {
        res.end('ok')
        return
      }
      // Left unanswered: the client goes away first.
      seen.push(new Promise((resolve) => signal.addEventListener('abort', () => resolve())))
    })
    expect(await raw(port, ['GET /answered HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n'])).toContain('ok')
    const socket = connect(port, '127.0.0.1')
    socket.write('GET /left HTTP/1.1\r\nhost: t\r\n\r\n')
    await until(() => seen.length === 1)
    socket.destroy()
    await seen[0]
    expect(signals.map((s) => s.aborted)).toEqual([false, true])
  })
})
