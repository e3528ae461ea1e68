import { Readable } from 'node:stream'
import { Pool } from 'undici'
import type { RouteConfig } from '../../config/schema.js'
import { ForwardError, type Forward, type ForwardRequest } from '../../gateway/forward.js'
import { HeaderList } from '../../http/header-list.js'
import type { BodySource } from '../../http/inbound.js'
import { wholeAnswerLimit } from '../../gateway/outcome.js'
import { upstreamTlsKey } from '../../config/upstream-tls.js'
import { httpsConnector, UpstreamTlsError, type TlsMaterial, type UpstreamTlsMaterial } from './upstream-tls.js'

const notSent = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'UND_ERR_CONNECT_TIMEOUT'])

/** A Forward on undici pools (one per upstream origin, timeout and TLS identity), with its shutdown. */
export interface UndiciForward {
  forward: Forward
  /**
   * Uses new TLS material from now on: the pools of routes with `upstream_tls` are closed once
   * their requests in flight have finished, and the next request opens one with the new files.
   */
  replaceTls(tls: UpstreamTlsMaterial): void
  close(): Promise<void>
}

/**
 * Forwards with undici: keep-alive pools, connect/headers/body timeouts from
 * the route's `timeout_ms`, bodies streamed both ways and never decompressed. A route with
 * `upstream_tls` gets a pool of its own with the material `tls` holds for it (read at start,
 * `loadUpstreamTls`); every https pool's handshake failures are `tls` failures, nothing sent.
 *
 * @example
 * const { forward, close } = createUndiciForward({ tls: loadUpstreamTls(config.routes) })
 * const app = createApp({ config, store, forward })
 */
export function createUndiciForward(options: { connections?: number; tls?: UpstreamTlsMaterial } = {}): UndiciForward {
  const pools = new UpstreamPools(options)
  const forward: Forward = async ({ route, target, method, headers, body }) => {
    const flat = flatHeaders(headers)
    const pool = pools.poolFor(route)
    let res
    try {
      res = await pool.request({
        path: route.upstream.basePath + target,
        method: method as 'POST',
        headers: flat,
        body: nodeBody(body),
      })
    } catch (err) {
      throw classify(err)
    }
    const responseHeaders = headerListOf(res.headers)
    const empty = method === 'HEAD' || res.statusCode === 204 || res.statusCode === 304
    if (empty) res.body.resume()
    const declared = empty ? undefined : smallDeclaredLength(res.headers['content-length'])
    const answer = empty ? null : declared !== undefined ? await readSmall(res.body, declared) : toWebStream(res.body)
    return { status: res.statusCode, headers: responseHeaders, body: answer }
  }
  return { forward, replaceTls: (material) => pools.replaceTls(material), close: () => pools.close() }
}

/** The pools by upstream origin, timeout and TLS identity; the TLS ones are retired when their material is replaced. */
class UpstreamPools {
  private readonly pools = new Map<string, Pool>()
  private readonly retiring = new Set<Promise<void>>()
  private tls: UpstreamTlsMaterial | undefined

  constructor(private readonly options: { connections?: number; tls?: UpstreamTlsMaterial }) {
    this.tls = options.tls
  }

  poolFor(route: RouteConfig): Pool {
    const tlsKey = route.upstream_tls ? upstreamTlsKey(route.upstream_tls) : ''
    const key = `${route.upstream.origin} ${route.timeout_ms} ${tlsKey}`
    let pool = this.pools.get(key)
    if (!pool) {
      const material = tlsKey ? this.tls?.get(tlsKey) : undefined
      // Its files are read at start; a route without them here was wired without loadUpstreamTls.
      if (tlsKey && !material) throw new Error(`no TLS material loaded for route ${route.name}`)
      pool = poolOf(route, material, this.options.connections ?? 128)
      this.pools.set(key, pool)
    }
    return pool
  }

  replaceTls(material: UpstreamTlsMaterial): void {
    this.tls = material
    // A pool is taken and used in one synchronous step (the forward), so none is closed under a request.
    for (const [key, pool] of this.pools) {
      if (key.endsWith(' ')) continue // no upstream_tls: its key ends in an empty TLS identity
      this.pools.delete(key)
      const closing = pool.close().catch(() => {}).finally(() => this.retiring.delete(closing))
      this.retiring.add(closing)
    }
  }

  async close(): Promise<void> {
    await Promise.all([...this.pools.values()].map((p) => p.close()))
    await Promise.all(this.retiring)
    this.pools.clear()
  }
}

/** The request's header fields as undici takes them. */
function flatHeaders(headers: ForwardRequest['headers']): Record<string, string> {
  const flat: Record<string, string> = {}
  headers.forEach((value, name) => {
    flat[name] = value
  })
  return flat
}

/** The upstream's header fields, a repeated one kept as its lines. */
function headerListOf(headers: Record<string, string | string[] | undefined>): HeaderList {
  const list = new HeaderList()
  for (const name in headers) {
    const value = headers[name]
    if (typeof value === 'string') list.append(name, value)
    else if (value !== undefined) for (const v of value) list.append(name, v)
  }
  return list
}

/** A route's pool: timeouts from `timeout_ms`, an https origin through the connector that tells handshake failures apart. */
function poolOf(route: RouteConfig, material: TlsMaterial | undefined, connections: number): Pool {
  const https = route.upstream.origin.startsWith('https:')
  return new Pool(route.upstream.origin, {
    connections,
    connect: https ? httpsConnector(material, route.timeout_ms) : { timeout: route.timeout_ms },
    headersTimeout: route.timeout_ms,
    bodyTimeout: route.timeout_ms,
  })
}

/**
 * The declared length of an answer to read whole before it is handed on: up to the
 * same `wholeAnswerLimit` the pipeline reads a held key's answer to. Node's data plane then
 * writes headers and body in one call, with no Web stream between the two sockets.
 */
function smallDeclaredLength(value: string | string[] | undefined): number | undefined {
  if (typeof value !== 'string' || !/^\d{1,6}$/.test(value)) return undefined
  const length = Number(value)
  return length <= wholeAnswerLimit ? length : undefined
}

/**
 * Reads a small body whole. If it breaks off (a reset, a length other than declared), the
 * client still gets what the upstream sent and then the error, as it would have streamed.
 * Read by its events: `for await` built an async iterator and its promises per answer.
 */
function readSmall(body: Readable, declared: number): Promise<Uint8Array | ReadableStream<Uint8Array>> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = []
    let size = 0
    let settled = false
    const settle = (answer: Uint8Array | ReadableStream<Uint8Array>) => {
      if (settled) return
      settled = true
      body.off('data', onData)
      resolve(answer)
    }
    const onData = (chunk: Buffer) => {
      chunks.push(chunk)
      size += chunk.byteLength
    }
    body.on('data', onData)
    body.once('end', () => {
      if (size !== declared) settle(brokenAfter(chunks, new Error('the upstream sent another length than it declared')))
      else settle(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, size))
    })
    // The 'error' listener stays: an error event nobody hears would end the process.
    body.on('error', (err) => {
      if (!settled) settle(brokenAfter(chunks, err))
    })
    // 'close' follows every 'end': build the broken stream (and its Error) only when it did not.
    body.once('close', () => {
      if (!settled) settle(brokenAfter(chunks, new Error('the upstream closed the answer before its end')))
    })
  })
}

function brokenAfter(chunks: Buffer[], err: Error): ReadableStream<Uint8Array> {
  return new ReadableStream<Uint8Array>({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(chunk)
      controller.error(err)
    },
  })
}

/**
 * Node 20's Readable.toWeb throws an uncaught ERR_INVALID_STATE when the
 * consumer cancels mid-body (a client that disconnects), killing the process
 * (nodejs/node#54205). This pull-based adapter never enqueues after a cancel.
 */
function toWebStream(body: Readable): ReadableStream<Uint8Array> {
  const chunks = body[Symbol.asyncIterator]()
  let cancelled = false
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const { value, done } = await chunks.next()
        if (cancelled) return
        if (done) controller.close()
        else controller.enqueue(value as Uint8Array)
      } catch (err) {
        if (!cancelled) controller.error(err)
      }
    },
    cancel() {
      cancelled = true
      // Hono cancels before the first pull when the client is already gone; nothing listens
      // for the abort error yet, and an unheard 'error' event would end the process.
      body.on('error', () => {})
      body.destroy()
    },
  }, { highWaterMark: 0 })
}

/** The body as undici takes it: bytes, or a Node stream (Node's inbound already passes one). */
function nodeBody(body: BodySource): Uint8Array | Readable | null {
  if (body === null || body instanceof Uint8Array || body instanceof Readable) return body
  // Readable.from iterates a Web stream too; unlike Readable.fromWeb it needs no Web-stream controller.
  return Readable.from(body as AsyncIterable<Uint8Array>)
}

function classify(err: unknown): ForwardError {
  if (err instanceof UpstreamTlsError) return new ForwardError('tls', false)
  const code = (err as { code?: string }).code ?? ''
  if (notSent.has(code)) return new ForwardError('unreachable', false)
  if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') return new ForwardError('timeout', true)
  return new ForwardError('reset', true)
}
