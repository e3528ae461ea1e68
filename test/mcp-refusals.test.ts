import { describe, expect, it } from 'vitest'
import { parseConfig } from '../src/config/schema.js'
import { withRpcId } from '../src/http/jsonrpc.js'
import { HeaderList } from '../src/http/header-list.js'
import { replayForMessage } from '../src/gateway/mcp.js'
import { compileRoute } from '../src/gateway/route.js'
import { FencegateError, problemAnswer, problemCatalog, type ProblemCode } from '../src/http/problems.js'
import { backends } from './helpers/backends.js'
import { sharedGateway } from './helpers/fresh-gateway.js'
import { testConfig } from './helpers/gateway.js'
import { ticketsRoute } from './helpers/mcp-ticket-server.js'

// The messages no SDK sends, sent raw: what cannot be decided per message is refused, never
// forwarded unchecked (issue 42, "No way around a rule").
describe('an MCP route refuses what it cannot decide per message', () => {
  const fx = sharedGateway(backends()[0]!, ({ upstream }) => ({ config: testConfig([ticketsRoute(upstream.url)]) }))
  const call = (id: unknown, name: string, extra: Record<string, unknown> = {}) =>
    ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: { ticket_id: 'T-raw', title: 't' }, _meta: { 'io.fencegate/fence': 1 } }, ...extra })
  const post = async (body: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(`${fx.gw.url}/mcp`, {
      method: 'POST', body: typeof body === 'string' ? body : JSON.stringify(body),
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
    })
    return { status: res.status, type: res.headers.get('content-type'), json: await res.json() as { id: unknown; error?: { code: number; message: string; data: Record<string, unknown> } } }
  }

  it.each([
    ['a JSON-RPC batch', [call(1, 'search'), call(2, 'create_ticket')], /batch/],
    ['a JSON value that is not one object', '"tools/call"', /not one JSON-RPC message/],
    ['strict JSON only', '{"jsonrpc":"2.0","id":4,"method":"tools/call",}', /strict JSON/],
    ['a key named twice', '{"jsonrpc":"2.0","id":5,"method":"tools/call","method":"ping"}', /.+/],
  ])('%s: 400 with a JSON-RPC error of id null, nothing forwarded', async (_what, body, detail) => {
    const before = fx.upstream.received.length
    const res = await post(body)
    expect(res.status).toBe(400)
    expect(res.type).toBe('application/json')
    expect(res.json).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32600 } })
    expect(['invalid_request', 'unreadable_body']).toContain(res.json.error!.data.code)
    expect(res.json.error!.message).toMatch(detail)
    expect(fx.upstream.received.length).toBe(before)
  })

  it.each([
    ['an object that is not JSON-RPC 2.0', { id: 3, method: 'tools/call', params: { name: 'search' } }, {}],
    ['a tools/call without a string params.name', { jsonrpc: '2.0', id: 'n1', method: 'tools/call', params: { name: 7 } }, {}],
    ['Mcp-Method contradicting the body', call('n2', 'create_ticket'), { 'mcp-method': 'tools/list' }],
    ['Mcp-Name contradicting the body', call('n3', 'create_ticket'), { 'mcp-method': 'tools/call', 'mcp-name': 'search' }],
    ['Mcp-Name in base64 contradicting the body', call('n4', 'create_ticket'), { 'mcp-name': `=?base64?${btoa('search')}?=` }],
  ])('%s: answered to its own id with invalid_request, nothing forwarded', async (_what, body, headers) => {
    const before = fx.upstream.received.length
    const res = await post(body, headers)
    expect(res.status).toBe(200)
    expect(res.json).toMatchObject({ jsonrpc: '2.0', id: (body as { id: unknown }).id, error: { code: -32600, data: { code: 'invalid_request', status: 400 } } })
    expect(fx.upstream.received.length).toBe(before)
  })

  it('Mcp-Method and Mcp-Name that agree with the body pass (a base64 name too)', async () => {
    const res = await post(call('ok', 'search'), { 'mcp-method': 'tools/call', 'mcp-name': `=?base64?${btoa('search')}?=` })
    expect(res.status).toBe(200)
    expect(fx.upstream.received.at(-1)?.headers['mcp-method']).toBe('tools/call')
  })

  it('a notification refused is told by its HTTP status (it has no id to answer)', async () => {
    const res = await post({ jsonrpc: '2.0', method: 'notifications/initialized' }, { 'mcp-method': 'ping' })
    expect(res.status).toBe(400)
    expect(res.json).toMatchObject({ type: 'urn:fencegate:problem:invalid_request', code: 'invalid_request' })
  })

  it('GET and DELETE of the path pass through as the session\'s stream and its end', async () => {
    for (const method of ['GET', 'DELETE']) {
      const res = await fetch(`${fx.gw.url}/mcp`, { method, headers: { 'mcp-session-id': 's-1' } })
      expect(res.status).toBe(200)
      expect(fx.upstream.received.at(-1)).toMatchObject({ method, path: '/mcp' })
    }
  })
})

describe('the mcp configuration', () => {
  const base = { name: 'm', method: 'POST', path: '/mcp', upstream: 'http://127.0.0.1:9100', fence: 'off' }
  const problems = (route: Record<string, unknown>) => {
    try {
      parseConfig({ routes: [route] })
      return []
    } catch (err) {
      return (err as { problems: string[] }).problems
    }
  }
  it.each([
    [{ ...base, mcp: [{ tool: 'a', method: 'b' }] }, /exactly one of tool or method/],
    [{ ...base, mcp: [{ fence: 'required' }] }, /exactly one of tool or method/],
    [{ ...base, mcp: [{ method: 'tools/call' }] }, /matched per tool/],
    [{ ...base, mcp: [{ tool: 'a', fence: 'required' }] }, /mcp\[0\]\.entity: required when fence is required/],
    [{ ...base, mcp: [{ tool: 'a' }, { tool: 'a' }] }, /already names tool a/],
    [{ ...base, method: 'PUT', mcp: [{ tool: 'a' }] }, /an MCP route is POST/],
    [{ ...base, mcp: [{ tool: 'a', entity: 't:{params.id}', fence: 'required' }] }, /params\.id, which \/mcp does not define/],
    [{ ...base, mcp: [{ tool: 'a', upstream: 'http://x' }] }, /upstream/],
  ])('refuses %j', (route, message) => {
    expect(problems(route).join('\n')).toMatch(message)
  })

  it('a rule\'s scopes add to the route\'s; its other fields are the route\'s unless it sets them', () => {
    const config = parseConfig({ auth: { mode: 'jwt', issuer: 'i', audience: 'a', hs256_secret: 'x'.repeat(32) }, routes: [{ ...base, scopes: ['mcp:use'], timeout_ms: 3000, mcp: [{ tool: 'a', scopes: ['tickets:write'], fence: 'optional', entity: 't:{body.params.arguments.id}' }] }] })
    const rule = compileRoute(config.routes[0]!).mcp!.tools.get('a')!
    expect(rule.config).toMatchObject({ name: 'm/a', scopes: ['mcp:use', 'tickets:write'], timeout_ms: 3000, fence: 'optional', idempotency: 'off' })
    expect(rule.answers).toBe('jsonrpc')
    expect(compileRoute(config.routes[0]!).mcp!.passthrough.config).toMatchObject({ fence: 'off', idempotency: 'off', scopes: ['mcp:use'] })
  })

  it('an MCP route also claims its path\'s GET and DELETE', () => {
    expect(() => parseConfig({ routes: [{ ...base, mcp: [{ tool: 'a' }] }, { ...base, name: 'g', method: 'GET' }] })).toThrow(/another route already matches GET \/mcp/)
  })
})

describe('a stored answer with a duplicate\'s own id', () => {
  const splice = (body: string, type: string, id: string | number) => new TextDecoder().decode(withRpcId(new TextEncoder().encode(body), type, id))
  it('drops Mcp-Session-Id from a replayed answer and gives it the duplicate\'s id', () => {
    const answer = replayForMessage({ status: 200, headers: new HeaderList([['content-type', 'application/json'], ['mcp-session-id', 's-1']]), body: new TextEncoder().encode('{"jsonrpc":"2.0","id":1,"result":{}}') }, 'n-9')
    expect(answer.headers.get('mcp-session-id')).toBeNull()
    expect(new TextDecoder().decode(answer.body as Uint8Array)).toBe('{"jsonrpc":"2.0","id":"n-9","result":{}}')
  })
  it('replaces the top-level id of a JSON answer, every other byte as stored', () => {
    expect(splice('{"result":{"id":1,"s":"\\"id\\":1"},"jsonrpc":"2.0","id":1}', 'application/json', 'n-2')).toBe('{"result":{"id":1,"s":"\\"id\\":1"},"jsonrpc":"2.0","id":"n-2"}')
  })
  it('replaces it in each data line of an event stream that is a response, not in the server\'s own requests', () => {
    const stream = 'event: message\r\ndata: {"method":"sampling/createMessage","id":0,"jsonrpc":"2.0"}\r\n\r\nevent: message\r\ndata: {"result":{},"jsonrpc":"2.0","id":4}\r\n\r\n'
    expect(splice(stream, 'text/event-stream', 9)).toBe(stream.replace('"id":4', '"id":9'))
  })
})

describe('every problem code as a JSON-RPC error answer', () => {
  it.each(Object.keys(problemCatalog) as ProblemCode[])('%s: 200 to the message\'s id, data.code the code, a JSON-RPC error code that fits', async (code) => {
    const answer = problemAnswer(new FencegateError(code, 'why', { entity: 'ticket:1' }, { 'retry-after': '1' }), 'rid', { jsonrpc: { id: 'm-1' } })
    expect(answer.status).toBe(200)
    expect(answer.headers.get('content-type')).toBe('application/json')
    expect(answer.headers.get('retry-after')).toBe('1')
    const body = JSON.parse(new TextDecoder().decode(answer.body as Uint8Array)) as { id: string; error: { code: number; message: string; data: Record<string, unknown> } }
    expect(body).toMatchObject({ jsonrpc: '2.0', id: 'm-1', error: { message: `${code}: why`, data: { code, status: problemCatalog[code].status, detail: 'why', request_id: 'rid', entity: 'ticket:1' } } })
    expect([-32600, -32602, -32080]).toContain(body.error.code)
    expect(body.error.data).not.toHaveProperty('error')
  })
})
