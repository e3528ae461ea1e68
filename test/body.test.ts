import { describe, expect, it } from 'vitest'
import { limitBody, wholeRequestLimit } from '../src/http/body.js'
import { FencegateError } from '../src/http/problems.js'

const post = (body: BodyInit, headers: Record<string, string> = {}) =>
  new Request('http://gateway.test/x', { method: 'POST', body, headers, duplex: 'half' } as RequestInit)

function streamOf(...chunks: Uint8Array[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(controller) {
      for (const c of chunks) controller.enqueue(c)
      controller.close()
    },
  })
}

async function drain(body: ReadableStream<Uint8Array>): Promise<number> {
  let size = 0
  for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) size += chunk.byteLength
  return size
}

describe('limitBody: a passed-through request body', () => {
  it('reads a small body of declared length whole, byte for byte', async () => {
    const sent = new TextEncoder().encode('{"amount":4200}')
    const limited = await limitBody(post(sent, { 'content-length': String(sent.byteLength) }), 1024)
    expect(limited.body).toBeInstanceOf(Uint8Array)
    expect(limited.body).toEqual(sent)
    expect(limited.exceeded()).toBe(false)
  })

  it('streams a declared body larger than the whole-read size', async () => {
    const sent = new Uint8Array(wholeRequestLimit + 1)
    const limited = await limitBody(post(sent, { 'content-length': String(sent.byteLength) }), 2 * wholeRequestLimit)
    expect(limited.body).toBeInstanceOf(ReadableStream)
    expect(await drain(limited.body as ReadableStream<Uint8Array>)).toBe(sent.byteLength)
  })

  it('refuses a declared length over the limit before reading anything', async () => {
    await expect(limitBody(post('x'.repeat(20), { 'content-length': '20' }), 10)).rejects.toMatchObject({ code: 'body_too_large' })
  })

  it('streams a body of no declared length, failing it once it passes the limit', async () => {
    const limited = await limitBody(post(streamOf(new Uint8Array(6), new Uint8Array(6))), 10)
    expect(limited.body).toBeInstanceOf(ReadableStream)
    await expect(drain(limited.body as ReadableStream<Uint8Array>)).rejects.toBeInstanceOf(FencegateError)
    expect(limited.exceeded()).toBe(true)
  })
})
