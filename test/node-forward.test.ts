import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { toResponse } from '../src/http/exchange.js'
import { createUndiciForward } from '../src/runtime/node/forward.js'
import { route, testConfig } from './helpers/gateway.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

/** The Node forward against a real upstream: how it hands back small and streamed answers. */
describe('the undici forward', () => {
  let upstream: TestUpstream
  const undici = createUndiciForward()

  beforeAll(async () => {
    upstream = await startUpstream((req, res) => {
      if (req.path === '/small') {
        res.writeHead(200, { 'content-length': '5' }).end('hello')
        return
      }
      if (req.path === '/chunked') {
        res.writeHead(200)
        res.write('hel')
        res.end('lo')
        return
      }
      // Declares 10 bytes, sends 5, then drops the connection.
      res.writeHead(200, { 'content-length': '10' })
      res.write('hello')
      setImmediate(() => res.socket?.destroy())
    })
  })
  afterAll(async () => {
    await undici.close()
    await upstream.close()
  })

  const send = (target: string) => {
    const rc = testConfig([route(upstream.url)]).routes[0]!
    return undici.forward({ route: rc, target, method: 'GET', headers: new Headers(), body: null })
  }

  it('reads a small answer of declared length whole and hands it on as bytes', async () => {
    const res = await send('/small')
    expect(res.body).toBeInstanceOf(Uint8Array)
    expect(new TextDecoder().decode(res.body as Uint8Array)).toBe('hello')
  })

  it('builds no broken stream for a small answer that ended whole (regression: its close event built one per answer)', async () => {
    const Original = globalThis.ReadableStream
    let built = 0
    globalThis.ReadableStream = class extends Original<Uint8Array> {
      constructor(...args: ConstructorParameters<typeof ReadableStream<Uint8Array>>) {
        super(...args)
        built++
      }
    } as typeof ReadableStream
    try {
      const res = await send('/small')
      // The answer's 'close' comes after its 'end' on the next ticks: let those run.
      await new Promise((resolve) => setImmediate(resolve))
      expect(res.body).toBeInstanceOf(Uint8Array)
      expect(built).toBe(0)
    } finally {
      globalThis.ReadableStream = Original
    }
  })

  it('streams an answer of undeclared length', async () => {
    const res = await send('/chunked')
    expect(res.body).toBeInstanceOf(ReadableStream)
    expect(await toResponse(res).text()).toBe('hello')
  })

  it('hands a small answer that broke off to the client as broken, not as complete', async () => {
    const res = await send('/broken')
    expect(res.body).toBeInstanceOf(ReadableStream)
    await expect(toResponse(res).text()).rejects.toThrow()
  })
})
