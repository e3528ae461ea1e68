import { execFile } from 'node:child_process'
import { rmSync, writeFileSync } from 'node:fs'
import { request } from 'node:http'
import { connect } from 'node:net'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { route } from './helpers/gateway.js'
import { startGatewayProcess, tempDir, writeConfig, type GatewayProcess } from './helpers/process.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

const MiB = 1024 * 1024
const chunk = Buffer.alloc(64 * 1024, 0x61)

/**
 * Node's http client as the issue reproduced it: a declared length, the whole body written in
 * 64 KiB chunks with backpressure, whatever the answer. Records the order of what happens, so
 * a socket error before the answer's end fails the test even when the status was seen.
 */
function nodeClientPost(url: string, size: number): Promise<{ events: string[]; status: number; body: string }> {
  return new Promise((resolve) => {
    const events: string[] = []
    let status = 0
    const parts: Buffer[] = []
    let sent = 0
    const done = () => resolve({ events, status, body: Buffer.concat(parts).toString() })
    const req = request(url, { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'x-execution-fence': '1', 'content-length': String(size) } }, (res) => {
      status = res.statusCode!
      res.on('data', (c: Buffer) => parts.push(c))
      res.on('end', () => events.push('answer-end'))
    })
    req.on('error', (err: NodeJS.ErrnoException) => events.push(`error:${err.code ?? err.message}`))
    req.on('close', () => setImmediate(done))
    const pump = () => {
      while (sent < size) {
        const piece = chunk.subarray(0, Math.min(chunk.length, size - sent))
        sent += piece.length
        if (!req.write(piece)) return void req.once('drain', pump)
      }
      req.end()
    }
    pump()
  })
}

const run = promisify(execFile)

/** curl with its own defaults (it sends Expect: 100-continue for a large body); stdout is the body, then the status. */
async function curlPost(url: string, file: string): Promise<{ status: number; body: string }> {
  const args = ['-sS', '-o', '-', '-w', '\n%{http_code}', '-H', 'content-type: application/json', '-H', 'x-execution-fence: 1', '--data-binary', `@${file}`, url]
  let stdout: string
  try {
    stdout = (await run('curl', args, { maxBuffer: 1024 * 1024 })).stdout
  } catch (err) {
    // A failed send after the answer still exits non-zero; the answer must be complete regardless.
    stdout = (err as { stdout: string }).stdout
  }
  const cut = stdout.lastIndexOf('\n')
  return { status: Number(stdout.slice(cut + 1)), body: stdout.slice(0, cut) }
}

const asChunk = Buffer.concat([Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from('\r\n')])

/** Raw bytes: a head, then body chunks (`chunked`: in chunked framing) until the gateway closes, or `limit` bytes. */
function rawSender(port: number, path: string, head: string, limit = Infinity): Promise<string> {
  const piece = head.includes('chunked') ? asChunk : chunk
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1')
    const got: Buffer[] = []
    let sent = 0
    socket.on('data', (c: Buffer) => got.push(c))
    socket.on('error', () => {})
    socket.on('close', () => resolve(Buffer.concat(got).toString()))
    const pump = () => {
      while (!socket.destroyed && sent < limit) {
        sent += chunk.length
        if (!socket.write(piece)) return void socket.once('drain', pump)
      }
    }
    socket.write(`POST ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Execution-Fence: 1\r\n${head}\r\n`, pump)
  })
}

/**
 * The gateway runs as its own process (the built CLI), as users run it: in one process with
 * the client, the event loop's turns hid the race (the answer was always read before the reset).
 */
describe('a body over server.max_request_body gets a readable 413', () => {
  let upstream: TestUpstream
  let gw: { url: string; process: GatewayProcess }
  let brief: { url: string; process: GatewayProcess }
  let dir: string

  async function gateway(server: Record<string, unknown>): Promise<{ url: string; process: GatewayProcess }> {
    const routes = [route(upstream.url), route(upstream.url, { name: 'open', path: '/open/:invoice_id', fence: 'off' })]
    const file = writeConfig({ server: { port: 0, admin_port: 0, max_request_body: '1MiB', ...server }, log: { level: 'info' }, routes })
    // tempDir: the embedded store's directory goes with the run (a run left two behind before).
    const started = await startGatewayProcess(['--config', file, '--data-dir', tempDir('fencegate-413-data-')])
    return { url: started.dataUrl, process: started }
  }

  beforeAll(async () => {
    upstream = await startUpstream()
    gw = await gateway({})
    // Short lingering, to see a sender that never stops, or stops without ending, cut off.
    brief = await gateway({ lingering_time: '300ms', lingering_timeout: '200ms' })
    dir = tempDir('fencegate-413-')
    for (const size of [2, 8, 32]) writeFileSync(join(dir, `${size}`), Buffer.alloc(size * MiB, 0x61))
  })
  afterAll(async () => {
    await gw?.process.stop()
    await brief?.process.stop()
    await upstream?.close()
    if (dir) rmSync(dir, { recursive: true, force: true })
  })

  const cases = [2, 8, 32].flatMap((size) => [['fenced', '/payments/1/capture', size], ['fence: off', '/open/1', size]] as const)
  const expectProblem = (body: string) => expect(JSON.parse(body)).toMatchObject({ code: 'body_too_large', status: 413, limit: MiB })

  it.each(cases)('Node http client, %s route (%s), %i MiB: the whole problem, before any socket error', async (_what, path, size) => {
    const res = await nodeClientPost(`${gw.url}${path}`, size * MiB)
    expect(res.events).toEqual(['answer-end'])
    expect(res.status).toBe(413)
    expectProblem(res.body)
  })

  it.each(cases)('undici fetch, %s route (%s), %i MiB', async (_what, path, size) => {
    const res = await fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-execution-fence': '1' }, body: Buffer.alloc(size * MiB, 0x61) })
    expect(res.status).toBe(413)
    expectProblem(await res.text())
  })

  it.each(cases)('curl, %s route (%s), %i MiB', async (_what, path, size) => {
    const res = await curlPost(`${gw.url}${path}`, join(dir, `${size}`))
    expect(res.status).toBe(413)
    expectProblem(res.body)
  })

  it('nothing of a refused body reaches the upstream', () => {
    expect(upstream.received).toHaveLength(0)
  })

  it.each([
    ['a declared length it never stops sending', 'Content-Length: 1099511627776\r\n'],
    ['a chunked body that never ends', 'Transfer-Encoding: chunked\r\n'],
  ])('a sender of %s is answered 413 and then cut off after lingering_time', async (_what, head) => {
    const got = await rawSender(Number(new URL(brief.url).port), '/payments/1/capture', head)
    expect(got).toMatch(/^HTTP\/1\.1 413 /)
    expect(got).toContain('"code":"body_too_large"')
  })

  it('a sender that stops in the middle of its body is cut off after lingering_timeout', async () => {
    const got = await rawSender(Number(new URL(brief.url).port), '/open/1', `Content-Length: ${8 * MiB}\r\n`, 2 * chunk.length)
    expect(got).toMatch(/^HTTP\/1\.1 413 /)
  })

  it('a connection whose refused body was sent to its end serves the next request', async () => {
    const agent = new (await import('node:http')).Agent({ keepAlive: true, maxSockets: 1 })
    try {
      const post = (body: Buffer) => new Promise<{ status: number; socket: unknown }>((resolve, reject) => {
        const req = request(`${gw.url}/open/1`, { method: 'POST', agent, headers: { 'content-length': String(body.length) } }, (res) => {
          res.resume()
          res.on('end', () => resolve({ status: res.statusCode!, socket: req.socket }))
        })
        req.on('error', reject)
        req.end(body)
      })
      const first = await post(Buffer.alloc(2 * MiB, 0x61))
      const second = await post(Buffer.from('{}'))
      expect([first.status, second.status]).toEqual([413, 200])
      expect(second.socket).toBe(first.socket)
    } finally {
      agent.destroy()
    }
  })
})
