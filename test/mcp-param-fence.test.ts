import { Client, ProtocolError, StreamableHTTPClientTransport } from '@modelcontextprotocol/client'
import { createMcpHandler, McpServer } from '@modelcontextprotocol/server'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { z } from 'zod'
import { parseConfig } from '../src/config/schema.js'
import { backends, type TestDb } from './helpers/backends.js'
import { startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { answerWith, listenOnLoopback, readBody } from './helpers/mcp-http.js'
import { ticketsRoute } from './helpers/mcp-ticket-server.js'

// A fence given as a tool argument (`fence_argument`), which the 2.x SDK mirrors on 2026-07-28
// as `Mcp-Param-Fence` for an argument declared `"x-mcp-header": "Fence"` (SEP-2243): read from
// the body, and the mirrored header only where the body agrees with it (issue 42).

interface Received { tool: string; ticket: string; fence: string | undefined; mirrored: string | undefined }

/** The 2.x SDK's stateless server (JSON answers) whose create_ticket takes the fence as an argument, mirrored as a header. */
async function startServer() {
  const received: Received[] = []
  const handler = createMcpHandler(() => {
    const server = new McpServer({ name: 'tickets-fence-arg', version: '2.0.0' })
    const inputSchema = z.object({ ticket_id: z.string(), title: z.string(), fence: z.number().int().meta({ 'x-mcp-header': 'Fence' }) })
    server.registerTool('create_ticket', { inputSchema }, async ({ ticket_id }) => ({ content: [{ type: 'text', text: `created ${ticket_id}` }] }))
    return server
  }, { responseMode: 'json' })
  const server = await listenOnLoopback(async (req, res) => {
    const body = req.method === 'POST' ? await readBody(req) : undefined
    const message = body ? JSON.parse(body.toString('utf8')) as { method?: string; params?: { name: string; arguments: { ticket_id: string } } } : undefined
    if (message?.method === 'tools/call') {
      received.push({ tool: message.params!.name, ticket: message.params!.arguments.ticket_id, fence: req.headers['x-execution-fence'] as string | undefined, mirrored: req.headers['mcp-param-fence'] as string | undefined })
    }
    await answerWith(handler, req, res, body)
  }, () => handler.close())
  return { ...server, received }
}

/** The recipe's route, its create_ticket rule reading the fence from the `fence` argument. */
function fenceArgumentRoute(upstream: string): Record<string, unknown> {
  const route = ticketsRoute(upstream)
  const rules = (route.mcp as Record<string, unknown>[]).map((r) => (r.tool === 'create_ticket' ? { ...r, fence_argument: 'fence' } : r))
  return { ...route, mcp: rules }
}

describe.each(backends())('a fence in a tool argument, mirrored as Mcp-Param-Fence, on $name', (backend) => {
  let t: TestDb
  let server: Awaited<ReturnType<typeof startServer>>
  let gw: TestGateway
  const clients: Client[] = []

  beforeAll(async () => {
    t = await backend.open()
    server = await startServer()
    gw = await startTestGateway({ config: testConfig([fenceArgumentRoute(server.url)]), store: t.store })
  })
  afterAll(async () => {
    await Promise.all(clients.map((c) => c.close()))
    await gw?.close()
    await server?.close()
    await t?.close()
  })

  const post = async (args: Record<string, unknown>, headers: Record<string, string> = {}, meta: Record<string, unknown> = {}, name = 'create_ticket') => {
    const res = await fetch(`${gw.url}/mcp`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2026-07-28', 'mcp-method': 'tools/call', 'mcp-name': name, ...headers },
      body: JSON.stringify({ jsonrpc: '2.0', id: 'p1', method: 'tools/call', params: { name, arguments: args, _meta: { 'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': {}, ...meta } } }),
    })
    return { status: res.status, json: await res.json() as { result?: unknown; error?: { code: number; message: string; data: Record<string, unknown> } } }
  }
  const forwarded = (ticket: string) => server.received.filter((r) => r.ticket === ticket)

  it('the 2.x SDK (2026-07-28) sends the fence argument and Mcp-Param-Fence: the gateway fences on it; a stale one is refused before the server', async () => {
    const client = new Client({ name: 'agent', version: '2.0.0' }, { versionNegotiation: { mode: { pin: '2026-07-28' } } })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp`)))
    clients.push(client)
    await client.listTools() // the client learns the x-mcp-header declaration from tools/list
    await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-pf1', title: 'a2', fence: 2 }, _meta: { 'io.fencegate/idempotency-key': 'pf1-a2' } })
    const stale = await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-pf1', title: 'a1', fence: 1 }, _meta: { 'io.fencegate/idempotency-key': 'pf1-a1' } }).catch((e: unknown) => e)
    expect(stale).toBeInstanceOf(ProtocolError)
    expect((stale as ProtocolError & { data: Record<string, unknown> }).data).toMatchObject({ code: 'stale_fence', presented_fence: '1', highest_fence: '2' })
    expect(forwarded('T-pf1')).toEqual([{ tool: 'create_ticket', ticket: 'T-pf1', fence: '2', mirrored: '2' }])
  })

  it.each([
    ['Mcp-Param-Fence contradicting the body\'s argument', { ticket_id: 'T-pf2', title: 't', fence: 2 }, { 'mcp-param-fence': '3' }],
    ['Mcp-Param-Fence without the argument in the body', { ticket_id: 'T-pf2', title: 't' }, { 'mcp-param-fence': '3', 'x-execution-fence': '3' }],
    ['Mcp-Param-Fence in base64 contradicting the body', { ticket_id: 'T-pf2', title: 't', fence: 2 }, { 'mcp-param-fence': `=?base64?${btoa('3')}?=` }],
  ])('%s: invalid_request to its own id, nothing forwarded', async (_what, args, headers) => {
    const res = await post(args, headers, { 'io.fencegate/idempotency-key': `pf2-${Object.keys(headers).length}` })
    expect(res.json).toMatchObject({ error: { code: -32600, data: { code: 'invalid_request', status: 400 } } })
    expect(res.json.error!.message).toMatch(/Mcp-Param-Fence/i)
    expect(forwarded('T-pf2')).toEqual([])
  })

  it.each([
    ['X-Execution-Fence', { 'x-execution-fence': '3' }, {}],
    ['_meta', {}, { 'io.fencegate/fence': 3 }],
  ])('the argument and a fence in %s that differ: invalid_fence, nothing forwarded', async (_where, headers, meta) => {
    const res = await post({ ticket_id: 'T-pf3', title: 't', fence: 2 }, { 'mcp-param-fence': '2', ...headers }, { 'io.fencegate/idempotency-key': 'pf3', ...meta })
    expect(res.json).toMatchObject({ error: { code: -32602, data: { code: 'invalid_fence', status: 400 } } })
    expect(res.json.error!.message).toMatch(/params\.arguments\.fence \(2\)|name different fences/)
    expect(forwarded('T-pf3')).toEqual([])
  })

  it('an agreeing header in base64 and the same fence in X-Execution-Fence pass', async () => {
    const res = await post({ ticket_id: 'T-pf4', title: 't', fence: 4 }, { 'mcp-param-fence': `=?base64?${btoa('4')}?=`, 'x-execution-fence': '4' }, { 'io.fencegate/idempotency-key': 'pf4' })
    expect(res.json).toMatchObject({ result: { content: [{ text: 'created T-pf4' }] } })
    expect(forwarded('T-pf4')).toEqual([{ tool: 'create_ticket', ticket: 'T-pf4', fence: '4', mirrored: `=?base64?${btoa('4')}?=` }])
  })

  it('a tool whose rule names no fence argument never reads Mcp-Param-Fence as a fence', async () => {
    const res = await post({ ticket_id: 'T-pf5', comment_id: 'c', text: 't' }, { 'mcp-param-fence': '5' }, { 'io.fencegate/idempotency-key': 'pf5' }, 'add_comment')
    expect(res.json).toMatchObject({ error: { data: { code: 'fence_required' } } })
  })
})

describe('the fence_argument setting', () => {
  it('exists on a tool\'s rule only, and names one argument', () => {
    const base = { name: 'm', method: 'POST', path: '/mcp', upstream: 'http://127.0.0.1:9100', fence: 'off' }
    const problems = (mcp: unknown[]) => {
      try {
        parseConfig({ routes: [{ ...base, mcp }] })
        return ''
      } catch (err) {
        return (err as { problems: string[] }).problems.join('\n')
      }
    }
    expect(problems([{ method: 'tasks/cancel', fence_argument: 'fence' }])).toMatch(/fence_argument: a tool argument exists on a tool's rule only/)
    expect(problems([{ tool: 'a', fence_argument: 'a.b' }])).toMatch(/fence_argument: expected an argument name/)
    expect(problems([{ tool: 'a', fence_argument: 'fence' }])).toBe('')
  })
})
