/**
 * Clients that disconnect before or during a response must not kill the gateway process.
 *
 * Why this test exists: forward.ts used to hand undici's response body to Hono as
 * `Readable.toWeb(res.body)`. At the end of a timed `autocannon -c 50 -d 2` run, which
 * drops every connection that still has a request in flight, the gateway process died:
 * Hono cancelled the Web stream of a response whose client was gone, and Node 20's
 * adapter then enqueued undici's body data into the closed controller from a 'data'
 * handler, an ERR_INVALID_STATE nobody can catch (nodejs/node#54205). The in-process
 * test in gateway.test.ts does not reproduce it, so this one runs the built CLI
 * (`node dist/src/cli/main.js serve`) as a process of its own, replays that situation
 * with raw sockets, then checks that the process is alive and still serving.
 *
 * Each wave is ordered by events, not timers: 50 requests all reach the upstream, then
 * every client leaves (and its socket has closed), and only then does the upstream answer.
 * Clients leave both ways, because each way exposes a different crash: closing the
 * connection (FIN, as autocannon does) brought down the `Readable.toWeb` code every time;
 * resetting it (RST) makes Hono cancel the body before anything read from it, which must
 * not surface undici's abort as an unhandled 'error' event either.
 */
import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import type { ServerResponse } from 'node:http'
import { connect, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { stringify } from 'yaml'
import { post } from './helpers/gateway.js'
import { drainedOrClosed, startUpstream, type TestUpstream } from './helpers/upstream.js'

/** The built CLI; `npm test` builds it first (pretest). */
const cli = join(import.meta.dirname, '../dist/src/cli/main.js')

/** Concurrent clients per wave: the connection count of the autocannon run that crashed it. */
const clients = 50

interface Gateway {
  child: ChildProcess
  port: number
  dataUrl: string
  adminUrl: string
  /** Rejects once the process has exited, with the end of its stderr. */
  exited: Promise<never>
}

/** Starts `fencegate serve` on ports the OS picks and resolves when it logs `listening`. */
function startGateway(configFile: string): Promise<Gateway> {
  // Without DATABASE_URL the store is embedded PGlite, in the config's temp data_dir.
  const child = spawn(process.execPath, [cli, 'serve', '--config', configFile, '--port', '0', '--admin-port', '0'], {
    env: { ...process.env, DATABASE_URL: undefined },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let stderr = ''
  child.stderr!.on('data', (c: Buffer) => {
    stderr = (stderr + c.toString()).slice(-4000)
  })
  // 'close' rather than 'exit': stderr has been read to its end by then.
  const exited = new Promise<never>((_, reject) => {
    child.once('close', (code, signal) => reject(new Error(`the gateway process exited (${code ?? signal}):\n${stderr}`)))
  })
  exited.catch(() => {})
  return new Promise((resolve, reject) => {
    exited.catch(reject)
    let buffered = ''
    child.stdout!.on('data', (c: Buffer) => {
      buffered += c.toString()
      for (let nl = buffered.indexOf('\n'); nl >= 0; nl = buffered.indexOf('\n')) {
        const line = buffered.slice(0, nl)
        buffered = buffered.slice(nl + 1)
        let event: { event?: string; data_url?: string; admin_url?: string }
        try {
          event = JSON.parse(line)
        } catch {
          continue
        }
        if (event.event === 'listening') {
          resolve({ child, port: Number(new URL(event.data_url!).port), dataUrl: event.data_url!, adminUrl: event.admin_url!, exited })
        }
      }
    })
  })
}

/** A raw HTTP/1.1 fenced POST on a socket of its own, which the test drops when it chooses. */
function openRequest(port: number, invoice: number): { socket: Socket; closed: Promise<void> } {
  const socket = connect(port, '127.0.0.1', () => {
    socket.write(`POST /payments/${invoice}/capture HTTP/1.1\r\nhost: 127.0.0.1\r\nx-execution-fence: 1\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}`)
  })
  socket.on('error', () => {})
  return { socket, closed: new Promise((resolve) => socket.once('close', () => resolve())) }
}

/** Makes the upstream hold its next `count` requests; resolves with their responses once all have arrived. */
function holdRequests(upstream: TestUpstream, count: number): Promise<ServerResponse[]> {
  const held: ServerResponse[] = []
  return new Promise((resolve) => {
    upstream.handle((_req, res) => {
      held.push(res)
      if (held.length === count) resolve(held)
    })
  })
}

const closeOf = (res: ServerResponse) => new Promise<void>((resolve) => res.once('close', () => resolve()))

describe('the gateway process, under clients that disconnect', () => {
  let upstream: TestUpstream
  let gw: Gateway
  let dir: string

  /**
   * Waits for `p`, failing as soon as the gateway process exits. When `p` fails because
   * the process is going down (a reset connection), the failure reports the exit and the
   * crash on stderr instead, if the exit follows within a second.
   */
  const alive = <T>(p: Promise<T>): Promise<T> => Promise.race([p, gw.exited]).catch(async (err: unknown) => {
    let timer: NodeJS.Timeout | undefined
    await Promise.race([gw.exited, new Promise((resolve) => (timer = setTimeout(resolve, 1000)))]).finally(() => clearTimeout(timer))
    throw err
  })

  beforeAll(async () => {
    upstream = await startUpstream()
    dir = mkdtempSync(join(tmpdir(), 'fencegate-disconnect-'))
    const configFile = join(dir, 'fencegate.yaml')
    writeFileSync(configFile, stringify({
      store: { data_dir: join(dir, 'data') },
      log: { level: 'info' },
      routes: [{
        name: 'capture', method: 'POST', path: '/payments/:invoice_id/capture', upstream: upstream.url,
        entity: 'invoice:{params.invoice_id}', fence: 'required', timeout_ms: 5000,
      }],
    }))
    gw = await startGateway(configFile)
  })

  afterAll(async () => {
    if (gw && gw.child.exitCode === null && gw.child.signalCode === null) {
      const exit = new Promise((resolve) => gw.child.once('exit', resolve))
      gw.child.kill('SIGKILL')
      await exit
    }
    await upstream?.close()
    if (dir) rmSync(dir, { recursive: true, force: true })
  })

  /** One wave: `clients` requests in flight at the upstream, every client leaves, then the upstream answers. */
  async function leaveBeforeTheAnswer(leave: (socket: Socket) => void) {
    const responses = holdRequests(upstream, clients)
    const requests = Array.from({ length: clients }, (_, i) => openRequest(gw.port, i))
    const held = await alive(responses)
    for (const r of requests) leave(r.socket)
    await Promise.all(requests.map((r) => r.closed))
    const finished = held.map(closeOf)
    for (const res of held) {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ captured: true, pad: 'x'.repeat(2000) }))
    }
    await alive(Promise.all(finished))
  }

  it('stays up when clients close their connections before the upstream answers', async () => {
    await leaveBeforeTheAnswer((socket) => socket.destroy())
    await expectServing()
  })

  it('stays up when clients reset their connections before the upstream answers', async () => {
    await leaveBeforeTheAnswer((socket) => socket.resetAndDestroy())
    await expectServing()
  })

  it('stays up, and drops the upstream response, when clients leave in the middle of a streamed body', async () => {
    const responses = holdRequests(upstream, clients)
    const requests = Array.from({ length: clients }, (_, i) => openRequest(gw.port, i))
    const held = await alive(responses)
    // Each client leaves on the first response bytes it reads.
    for (const r of requests) r.socket.once('data', () => r.socket.destroy())
    // The upstream streams up to 8 MiB per response; the gateway must drop it once its client has left.
    const dropped = held.map(closeOf)
    const chunk = Buffer.alloc(16 * 1024, 'y')
    for (const res of held) {
      res.writeHead(200, { 'content-type': 'application/octet-stream' })
      void (async () => {
        for (let i = 0; i < 512 && !res.destroyed; i++) {
          if (!res.write(chunk)) await drainedOrClosed(res)
        }
        res.end()
      })()
    }
    await Promise.all(requests.map((r) => r.closed))
    await alive(Promise.all(dropped))
    await expectServing()
  })

  /** The same process still answers: it has not exited, its admin plane is healthy and a fenced request goes through. */
  async function expectServing() {
    upstream.handle((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"captured":true}')
    })
    const res = await alive(post(`${gw.dataUrl}/payments/1/capture`, '1'))
    expect(res.status).toBe(200)
    expect(res.json).toEqual({ captured: true })
    const health = await alive(fetch(`${gw.adminUrl}/health`))
    expect(health.status).toBe(200)
    expect(await health.json()).toMatchObject({ status: 'ok' })
    expect(gw.child.exitCode).toBeNull()
    expect(gw.child.signalCode).toBeNull()
  }
})
