import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { wholeAnswerLimit } from '../src/gateway/outcome.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { gate, startUpstream, type TestUpstream } from './helpers/upstream.js'

const keyed = (key: string) => ({ 'x-execution-fence': '1', 'idempotency-key': key, 'content-type': 'application/json' })

/** Polls the database until the key leaves `in_flight` (never the clock). */
async function settled(t: TestDb, key: string): Promise<string | undefined> {
  let state: string | undefined
  for (let i = 0; i < 500; i++) {
    state = (await t.store.getKey('default', key))?.state
    if (state !== 'in_flight') break
    await new Promise((r) => setTimeout(r, 10))
  }
  return state
}

describe.each(backends())('capturing the first answer for a key on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway

  beforeEach(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    gw = await startTestGateway({ config: testConfig([route(upstream.url, { idempotency: 'required' })]), store: t.store })
  })
  afterEach(async () => {
    await gw.close()
    await upstream.close()
    await t.close()
  })

  it('stores a small answer of declared length before the client sees any of it, then sends it whole with its length', async () => {
    const answer = JSON.stringify({ captured: true, padding: 'p'.repeat(1000) })
    upstream.handle((_req, res) => {
      res.writeHead(201, { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(answer)) })
      res.end(answer)
    })
    const res = await fetch(`${gw.url}/payments/42/capture`, { method: 'POST', headers: keyed('small'), body: '{}' })
    // Only the headers have been read: the record is already stored.
    expect((await t.store.getKey('default', 'small'))?.state).toBe('completed')
    expect([res.status, res.headers.get('content-length'), res.headers.get('transfer-encoding')]).toEqual([201, String(Buffer.byteLength(answer)), null])
    expect(await res.text()).toBe(answer)
    const replay = await post(`${gw.url}/payments/42/capture`, '1', { headers: { 'idempotency-key': 'small' } })
    expect([replay.status, replay.text, replay.headers.get('idempotent-replayed')]).toEqual([201, answer, 'true'])
  })

  it(`streams a declared answer over ${wholeAnswerLimit} bytes while capturing it, and still replays it byte for byte`, async () => {
    const { opened, open } = gate()
    const first = 'a'.repeat(1024)
    const rest = 'b'.repeat(wholeAnswerLimit)
    upstream.handle(async (_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': String(first.length + rest.length) })
      res.write(first)
      await opened
      res.end(rest)
    })
    const res = await fetch(`${gw.url}/payments/42/capture`, { method: 'POST', headers: keyed('large'), body: '{}' })
    const reader = res.body!.getReader()
    // The first bytes arrive while the upstream still holds the rest: nothing waits for the whole body.
    const chunk = await reader.read()
    expect(new TextDecoder().decode(chunk.value)).toMatch(/^a+$/)
    expect((await t.store.getKey('default', 'large'))?.state).toBe('in_flight')
    open()
    let text = new TextDecoder().decode(chunk.value)
    for (let next = await reader.read(); !next.done; next = await reader.read()) text += new TextDecoder().decode(next.value)
    expect(text).toBe(first + rest)
    expect(await settled(t, 'large')).toBe('completed')
    const replay = await post(`${gw.url}/payments/42/capture`, '1', { headers: { 'idempotency-key': 'large' } })
    expect([replay.text.length, replay.text === first + rest, replay.headers.get('idempotent-replayed')]).toEqual([first.length + rest.length, true, 'true'])
  })

  it('answers 502 for a small answer that broke before its declared length, recorded as not replayable and never executed again', async () => {
    upstream.handle((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' })
      res.write('{"captured":')
      setImmediate(() => res.socket?.destroy())
    })
    const broken = await post(`${gw.url}/payments/42/capture`, '1', { headers: { 'idempotency-key': 'broken' } })
    expect([broken.status, broken.json.code]).toEqual([502, 'upstream_unreachable'])
    expect(broken.text).not.toContain('captured')
    // Stored before the answer was sent: no polling needed.
    expect((await t.store.getKey('default', 'broken'))?.state).toBe('not_replayable')
    const dup = await post(`${gw.url}/payments/42/capture`, '1', { headers: { 'idempotency-key': 'broken' } })
    expect([dup.status, dup.json.code]).toEqual([409, 'response_not_replayable'])
    expect(upstream.received).toHaveLength(1)
  })
})
