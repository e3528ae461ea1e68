import { connect } from 'node:net'
import { describe, expect, it } from 'vitest'
import { backends } from './helpers/backends.js'
import { sharedGateway } from './helpers/fresh-gateway.js'
import { post, route, startTestGateway, testConfig } from './helpers/gateway.js'

/** Sends bytes exactly as written (fetch would normalise the target) and returns the status line and body. */
function raw(url: string, request: string): Promise<{ status: number; body: string }> {
  const { port } = new URL(url)
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), '127.0.0.1', () => socket.write(request))
    let data = ''
    socket.on('data', (c: Buffer) => {
      data += c
      const end = data.indexOf('\r\n\r\n')
      const length = /content-length: (\d+)/i.exec(data)
      if (end >= 0 && length && data.length >= end + 4 + Number(length[1])) socket.end()
    })
    socket.on('close', () => resolve({ status: Number(data.split(' ')[1]), body: data.slice(data.indexOf('\r\n\r\n') + 4) }))
    socket.on('error', reject)
  })
}

const postTo = (target: string, extra = '') => `POST ${target} HTTP/1.1\r\nhost: gateway.test\r\nx-execution-fence: 1\r\ncontent-length: 2\r\n${extra}connection: close\r\n\r\n{}`

describe('the configured upstream is the only destination', () => {
  const fx = sharedGateway(backends()[0]!, ({ upstream }) => ({
    config: testConfig([route(upstream.url), route(upstream.url, { name: 'admin', path: '/admin', fence: 'off', entity: undefined })]),
  }))

  it.each([
    ['/payments/../admin', 'dot segments'],
    ['/payments/1/../../admin', 'dot segments'],
    ['/payments/%2e%2e/admin', 'dot segments'],
    ['/payments/%2E%2E/1/capture', 'dot segments'],
    ['/payments/./1/capture', 'dot segments'],
    ['/payments/1%2f..%2fadmin/capture', 'encoded slashes'],
    // Each was forwarded with the route's credential before: Tomcat and Spring read them as /capture or invoice 42.
    ['/payments/..;/capture', 'path parameters'],
    ['/payments/%2e%2e;/capture', 'path parameters'],
    ['/payments/..%3B/capture', 'path parameters'],
    ['/payments/42;x/capture', 'path parameters'],
    ['/payments/42;jsessionid=1/capture', 'path parameters'],
    ['/payments/%252e%252e/capture', 'double-encoded'],
    ['/payments/42%2500/capture', 'double-encoded'],
    ['/payments/42%00/capture', 'NUL'],
    // Node's HTTP parser itself refuses a raw backslash in the target.
    ['/payments\\..\\admin', null],
    ['/payments%5c..%5cadmin/1/capture', 'backslashes'],
    ['http://evil.example/payments/1/capture', 'origin-form'],
    ['//evil.example/payments/1/capture', null],
  ])('refuses %s before routing', async (target, reason) => {
    const before = fx.upstream.received.length
    const res = await raw(fx.gw.url, postTo(target))
    expect(fx.upstream.received.length).toBe(before)
    if (reason) {
      expect(res.status).toBe(400)
      expect(JSON.parse(res.body)).toMatchObject({ code: 'invalid_request' })
      expect(JSON.parse(res.body).detail).toContain(reason)
    } else {
      expect([0, 400, 404]).toContain(Number.isNaN(res.status) ? 0 : res.status)
    }
  })

  it("keeps the client's X-Request-Id on a refused target", async () => {
    const res = await raw(fx.gw.url, postTo('/payments/../admin', 'x-request-id: mine-1\r\n'))
    expect(JSON.parse(res.body).request_id).toBe('mine-1')
  })

  it('ignores Host games: the upstream is reached at its own address', async () => {
    const res = await raw(fx.gw.url, postTo('/payments/1/capture', 'x-forwarded-host: evil.example\r\n'))
    expect(res.status).toBe(200)
    const last = fx.upstream.received.at(-1)!
    expect(last.headers.host).toBe(new URL(fx.upstream.url).host)
  })

  it('answers oversized headers with 431 and forwards nothing', async () => {
    const before = fx.upstream.received.length
    const res = await raw(fx.gw.url, postTo('/payments/1/capture', `x-big: ${'a'.repeat(20_000)}\r\n`))
    expect(res.status).toBe(431)
    expect(fx.upstream.received.length).toBe(before)
  })

  it('applies server.max_header_bytes, below Node\'s own default', async () => {
    const small = await startTestGateway({ config: testConfig([route(fx.upstream.url)], { server: { max_header_bytes: 4096 } }), store: fx.t.store })
    try {
      expect((await raw(small.url, postTo('/payments/9/capture', `x-mid: ${'a'.repeat(6000)}\r\n`))).status).toBe(431)
      expect((await raw(fx.gw.url, postTo('/payments/9/capture', `x-mid: ${'a'.repeat(6000)}\r\n`))).status).toBe(200)
    } finally {
      await small.close()
    }
  })

  it('refuses an entity longer than 512 characters', async () => {
    const res = await post(`${fx.gw.url}/payments/${'x'.repeat(600)}/capture`, '1')
    expect([res.status, res.json.code]).toEqual([400, 'entity_unresolved'])
  })
})
