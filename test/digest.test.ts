import { createHash, randomBytes } from 'node:crypto'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { createApp } from '../src/gateway/app.js'
import { sha256Hex } from '../src/http/body.js'
import { fingerprint, payloadFingerprint } from '../src/gateway/idempotency.js'
import { createUndiciForward, type UndiciForward } from '../src/runtime/node/forward.js'
import { nodeSha256Hex } from '../src/runtime/node/hash.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

const utf8 = (s: string) => new TextEncoder().encode(s)
const sha256 = (data: string | Uint8Array) => createHash('sha256').update(data).digest('hex')

describe('SHA-256 on Node', () => {
  it('node:crypto and Web Crypto give the same hex for empty, short, large and non-UTF-8 bytes', async () => {
    const inputs = [new Uint8Array(0), utf8('abc'), utf8('{"amount":100}'), new Uint8Array([0xff, 0xfe, 0x00, 0x80]), randomBytes(3 * 1024 * 1024 + 7)]
    for (const bytes of inputs) expect(nodeSha256Hex(bytes)).toBe(await sha256Hex(bytes))
    expect(nodeSha256Hex(utf8('abc'))).toBe('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad')
  })

  it('hashes only the view it is given, not the rest of its buffer', async () => {
    const whole = utf8('xxabcxx')
    const view = whole.subarray(2, 5)
    expect(nodeSha256Hex(view)).toBe(sha256('abc'))
    expect(await sha256Hex(view)).toBe(sha256('abc'))
  })
})

describe('the payload fingerprint', () => {
  it("is SHA-256 over method, route, path, query and the body's SHA-256, one per line", async () => {
    const body = utf8('{"amount":100}')
    const expected = sha256(`POST\ncapture\n/payments/42/capture\n?x=1\n${sha256(body)}`)
    expect(await payloadFingerprint('POST', 'capture', '/payments/42/capture', '?x=1', sha256(body))).toBe(expected)
    expect(await payloadFingerprint('POST', 'capture', '/payments/42/capture', '?x=1', sha256(body), nodeSha256Hex)).toBe(expected)
    expect(await fingerprint('POST', 'capture', '/payments/42/capture', '?x=1', body)).toBe(expected)
    expect(await fingerprint('POST', 'capture', '/payments/42/capture', '?x=1', body, nodeSha256Hex)).toBe(expected)
  })

  it('differs for every part of the payload, the body bytes included', async () => {
    const base = ['POST', 'capture', '/payments/42/capture', '', '{"a":1,"b":2}'] as const
    const of = (m: string, r: string, p: string, q: string, b: string) => fingerprint(m, r, p, q, utf8(b))
    const all = await Promise.all([
      of(...base),
      of('PUT', base[1], base[2], base[3], base[4]),
      of(base[0], 'refund', base[2], base[3], base[4]),
      of(base[0], base[1], '/payments/43/capture', base[3], base[4]),
      of(base[0], base[1], base[2], '?x=1', base[4]),
      of(base[0], base[1], base[2], base[3], '{"b":2,"a":1}'),
    ])
    expect(new Set(all).size).toBe(all.length)
  })
})

describe.each(backends())('a gateway hashing with node:crypto on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let undici: UndiciForward

  beforeEach(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    undici = createUndiciForward()
  })
  afterEach(async () => {
    await undici.close()
    await upstream.close()
    await t.close()
  })

  it('stores the same body hash and fingerprint as the Web Crypto default, so either replays the other', async () => {
    const config = testConfig([route(upstream.url, { idempotency: 'required' })])
    const nodeApp = createApp({ config, store: t.store, forward: undici.forward, digest: nodeSha256Hex })
    const webApp = createApp({ config, store: t.store, forward: undici.forward })
    const body = '{"amount":100}'
    const send = (app: typeof nodeApp, key: string, payload = body) => app.request('/payments/42/capture?x=1', {
      method: 'POST', headers: { 'x-execution-fence': '3', 'idempotency-key': key, 'content-type': 'application/json' }, body: payload,
    })

    const first = await send(nodeApp, 'k-node')
    expect(first.status).toBe(200)
    await first.text()
    const record = await t.store.getKey('default', 'k-node')
    expect(record?.fingerprint).toBe(sha256(`POST\ncapture\n/payments/42/capture\n?x=1\n${sha256(body)}`))

    const replay = await send(webApp, 'k-node')
    expect(replay.headers.get('idempotent-replayed')).toBe('true')
    expect((await send(webApp, 'k-node', '{"amount":101}')).status).toBe(422)

    await (await send(webApp, 'k-web')).text()
    expect((await t.store.getKey('default', 'k-web'))?.fingerprint).toBe(record?.fingerprint)
    expect((await send(nodeApp, 'k-web')).headers.get('idempotent-replayed')).toBe('true')
    expect(upstream.received).toHaveLength(2)

    const [reused] = await t.store.listAudit({ code: 'idempotency_key_reused', limit: 10 })
    expect(reused?.body_sha256).toBe(sha256('{"amount":101}'))
  })
})

describe.each(backends())('reading a buffered body on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway | undefined

  beforeEach(async () => {
    t = await backend.open()
    upstream = await startUpstream()
  })
  afterEach(async () => {
    await gw?.close()
    await upstream.close()
    await t.close()
  })

  const chunked = (url: string, body: string) => fetch(url, {
    method: 'POST',
    headers: { 'x-execution-fence': '1' },
    // A stream body has no Content-Length: it arrives chunked and is counted as it is read.
    body: new ReadableStream({ start(c) { c.enqueue(utf8(body.slice(0, 10))); c.enqueue(utf8(body.slice(10))); c.close() } }),
    duplex: 'half',
  } as RequestInit)

  it('refuses a chunked body over max_request_body on a fenced route, and forwards one at the limit whole', async () => {
    gw = await startTestGateway({ config: testConfig([route(upstream.url)], { server: { max_request_body: 64 } }), store: t.store })
    expect((await (await chunked(`${gw.url}/payments/1/capture`, 'x'.repeat(65))).json()).code).toBe('body_too_large')
    expect((await chunked(`${gw.url}/payments/1/capture`, 'y'.repeat(64))).status).toBe(200)
    expect((await post(`${gw.url}/payments/1/capture`, '1', { body: 'z'.repeat(64) })).status).toBe(200)
    expect(upstream.received.map((r) => r.body.toString())).toEqual(['y'.repeat(64), 'z'.repeat(64)])
  })

  it('refuses a body longer than the Content-Length it declared (a Request made in-process)', async () => {
    const undici = createUndiciForward()
    try {
      const app = createApp({ config: testConfig([route(upstream.url)], { server: { max_request_body: 64 } }), store: t.store, forward: undici.forward })
      const res = await app.request('/payments/1/capture', { method: 'POST', headers: { 'x-execution-fence': '1', 'content-length': '2' }, body: 'x'.repeat(65) })
      expect(res.status).toBe(413)
      expect((await res.json()).code).toBe('body_too_large')
      expect(upstream.received).toHaveLength(0)
    } finally {
      await undici.close()
    }
  })
})
