import { describe, expect, it } from 'vitest'
import { clientResponseHeaders, upstreamRequestHeaders } from '../src/gateway/forward.js'
import type { HeaderView } from '../src/http/exchange.js'

const hopByHop = [
  ['connection', 'keep-alive'],
  ['keep-alive', 'timeout=5, max=100'],
  ['transfer-encoding', 'chunked'],
  ['te', 'trailers'],
  ['trailer', 'x-checksum'],
  ['upgrade', 'websocket'],
  ['proxy-authenticate', 'Basic realm="proxy"'],
  ['proxy-authorization', 'Basic dXNlcjpwYXNz'],
  ['proxy-connection', 'keep-alive'],
  ['host', 'gateway.example.com'],
] as const

const endToEnd = [
  ['x-execution-fence', '42'],
  ['content-type', 'application/json'],
  ['authorization', 'Bearer token'],
  ['accept', 'application/json'],
  ['idempotency-key', 'k-1'],
  ['x-request-id', 'req-1'],
  ['cache-control', 'no-store'],
  ['etag', '"abc"'],
] as const

const directions = [
  ['upstreamRequestHeaders', upstreamRequestHeaders],
  ['clientResponseHeaders', clientResponseHeaders],
] as const

// In name order, as Web Headers lists them: the filters keep first-seen order, which is not part of their contract.
const entries = (h: HeaderView): [string, string][] => {
  const out: [string, string][] = []
  h.forEach((value, name) => out.push([name, value]))
  return out.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
}

it.each(['x-http-method-override', 'x-http-method', 'x-method-override', 'x-original-url', 'x-rewrite-url'])('drops %s on the way upstream: the route matched the method and path the gateway saw', (name) => {
  const headers = new Headers({ [name]: name.includes('url') ? '/admin/delete' : 'DELETE', accept: 'application/json' })
  expect(entries(upstreamRequestHeaders(headers))).toEqual([['accept', 'application/json']])
})

describe.each(directions)('%s', (_name, filter) => {
  it.each(hopByHop)('drops the hop-by-hop header %s', (name, value) => {
    const out = filter(new Headers({ [name]: value, 'x-execution-fence': '7' }))
    expect(out.has(name)).toBe(false)
    expect(out.get('x-execution-fence')).toBe('7')
  })

  it('drops every hop-by-hop header together, whatever their case', () => {
    const inbound = new Headers()
    for (const [name, value] of hopByHop) inbound.set(name.toUpperCase(), value)
    expect(entries(filter(inbound))).toEqual([])
  })

  it.each(endToEnd)('keeps the end-to-end header %s', (name, value) => {
    expect(filter(new Headers({ [name]: value })).get(name)).toBe(value)
  })

  it('drops headers named in Connection, case-insensitively and with odd spacing', () => {
    const out = filter(new Headers({
      connection: 'close, X-Debug ,x-trace,, ,  X-Hop-Token  ',
      'x-debug': '1',
      'x-trace': 'abc',
      'x-hop-token': 't',
      'x-kept': 'yes',
    }))
    expect(entries(out)).toEqual([['x-kept', 'yes']])
  })

  it('does not drop a header whose name only contains a Connection token', () => {
    const out = filter(new Headers({ connection: 'x-a', 'x-a': '1', 'x-ab': '2', 'x-a-b': '3' }))
    expect(entries(out)).toEqual([['x-a-b', '3'], ['x-ab', '2']])
  })

  it('keeps everything but hop-by-hop headers when Connection is absent', () => {
    const inbound = new Headers(Object.fromEntries(endToEnd))
    expect(entries(filter(inbound))).toEqual(entries(inbound))
  })

  it('keeps multi-valued headers', () => {
    const inbound = new Headers()
    inbound.append('accept', 'text/html')
    inbound.append('accept', 'application/json')
    expect(filter(inbound).get('accept')).toBe('text/html, application/json')
  })

  it('returns a new object and leaves its input untouched', () => {
    const inbound = new Headers({ connection: 'x-a', 'x-a': '1', host: 'h', 'x-b': '2' })
    const before = entries(inbound)
    const out = filter(inbound)
    expect(out).not.toBe(inbound)
    expect(entries(inbound)).toEqual(before)
    out.set('x-c', '3')
    expect(inbound.has('x-c')).toBe(false)
  })

  it('handles empty headers', () => {
    expect(entries(filter(new Headers()))).toEqual([])
  })
})

describe('content-length', () => {
  it('is dropped from requests sent upstream (the Forward sets its own)', () => {
    const out = upstreamRequestHeaders(new Headers({ 'content-length': '12', 'content-type': 'application/json' }))
    expect(out.has('content-length')).toBe(false)
    expect(out.get('content-type')).toBe('application/json')
  })

  it("is kept on responses returned to the client", () => {
    const out = clientResponseHeaders(new Headers({ 'content-length': '12', 'content-type': 'text/plain' }))
    expect(out.get('content-length')).toBe('12')
    expect(out.get('content-type')).toBe('text/plain')
  })

  it('is not invented on a response that had none', () => {
    expect(clientResponseHeaders(new Headers({ 'transfer-encoding': 'chunked' })).has('content-length')).toBe(false)
  })
})

describe('clientResponseHeaders', () => {
  it('keeps every Set-Cookie header separately', () => {
    const upstream = new Headers()
    upstream.append('set-cookie', 'a=1; Path=/')
    upstream.append('set-cookie', 'b=2; Path=/; HttpOnly')
    expect(clientResponseHeaders(upstream).getSetCookie()).toEqual(['a=1; Path=/', 'b=2; Path=/; HttpOnly'])
  })

  it('filters a realistic upstream response', () => {
    const out = clientResponseHeaders(new Headers({
      connection: 'keep-alive',
      'keep-alive': 'timeout=5',
      'content-type': 'application/json',
      'content-length': '27',
      date: 'Sun, 29 Nov 2026 10:00:00 GMT',
      'x-execution-fence': '9',
    }))
    expect(Object.fromEntries(entries(out))).toEqual({
      'content-type': 'application/json',
      'content-length': '27',
      date: 'Sun, 29 Nov 2026 10:00:00 GMT',
      'x-execution-fence': '9',
    })
  })
})

describe('upstreamRequestHeaders', () => {
  it('filters a realistic client request', () => {
    const out = upstreamRequestHeaders(new Headers({
      host: 'gateway:8080',
      connection: 'keep-alive, Upgrade',
      upgrade: 'h2c',
      'content-length': '2',
      'content-type': 'application/json',
      'x-execution-fence': '41',
      authorization: 'Bearer t',
      'proxy-authorization': 'Basic x',
      te: 'trailers',
    }))
    expect(Object.fromEntries(entries(out))).toEqual({
      'content-type': 'application/json',
      'x-execution-fence': '41',
      authorization: 'Bearer t',
    })
  })
})
