import { Client, ProtocolError, StreamableHTTPClientTransport } from '@modelcontextprotocol/client'
import { createMcpHandler, McpServer } from '@modelcontextprotocol/server'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { z } from 'zod'
import { backends, type TestDb } from './helpers/backends.js'
import { startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { answerWith, listenOnLoopback, readBody } from './helpers/mcp-http.js'
import { ticketsRoute, type ReceivedCall } from './helpers/mcp-ticket-server.js'

/** The ticket server on the 2.x line: `createMcpHandler` (stateless, 2026-07-28) behind `node:http`; `/mcp` streams, `/json/mcp` answers JSON. */
async function startV2TicketServer() {
  const calls: ReceivedCall[] = []
  const executions = new Map<string, number>()
  let created = 0
  const factory = () => {
    const server = new McpServer({ name: 'tickets-v2', version: '2.0.0' })
    server.registerTool('create_ticket', { inputSchema: z.object({ ticket_id: z.string(), title: z.string() }) }, async ({ ticket_id, title }) => {
      executions.set(ticket_id, (executions.get(ticket_id) ?? 0) + 1)
      return { content: [{ type: 'text', text: `created ${ticket_id} (${title}) #${++created}` }] }
    })
    server.registerTool('search', { inputSchema: z.object({ query: z.string() }) }, async ({ query }) => ({ content: [{ type: 'text', text: `results for ${query}` }] }))
    return server
  }
  const handlers = { sse: createMcpHandler(factory, { responseMode: 'sse' }), json: createMcpHandler(factory, { responseMode: 'json' }) }
  const server = await listenOnLoopback(async (req, res) => {
    const body = req.method === 'POST' ? await readBody(req) : undefined
    const message = body ? JSON.parse(body.toString('utf8')) as { method?: string; params?: { name?: string; arguments?: { ticket_id?: string } } } : undefined
    if (message?.method === 'tools/call') calls.push({ tool: message.params!.name!, ticket: message.params!.arguments?.ticket_id, fence: req.headers['x-execution-fence'] as string | undefined })
    await answerWith(req.url!.startsWith('/json/') ? handlers.json : handlers.sse, req, res, body)
  }, async () => {
    await Promise.all([handlers.sse.close(), handlers.json.close()])
  })
  return { ...server, calls, executions }
}

const meta = (fence?: number, key?: string) => ({
  ...(fence === undefined ? {} : { 'io.fencegate/fence': fence }),
  ...(key === undefined ? {} : { 'io.fencegate/idempotency-key': key }),
})
const text = (result: unknown) => (result as { content: { text: string }[] }).content[0]!.text

describe.each(backends())('MCP through fencegate with the official 2.x SDK (stateless, 2026-07-28), on $name', (backend) => {
  let t: TestDb
  let tickets: Awaited<ReturnType<typeof startV2TicketServer>>
  let gw: TestGateway
  const clients: Client[] = []

  beforeAll(async () => {
    t = await backend.open()
    tickets = await startV2TicketServer()
    gw = await startTestGateway({ config: testConfig([ticketsRoute(tickets.url), ticketsRoute(tickets.url, '/json/mcp', 'tickets-json')]), store: t.store })
  })
  afterAll(async () => {
    await Promise.all(clients.map((c) => c.close()))
    await gw?.close()
    await tickets?.close()
    await t?.close()
  })

  // Pinned: the 2.x client's default negotiation is 'legacy' (initialize, 2025-11-25), not the stateless protocol.
  const agent = async (headers: Record<string, string> = {}, path = '/mcp') => {
    const client = new Client({ name: 'agent', version: '2.0.0' }, { versionNegotiation: { mode: { pin: '2026-07-28' } } })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}${path}`), { requestInit: { headers } }))
    clients.push(client)
    return client
  }
  const refused = async (call: Promise<unknown>): Promise<ProtocolError & { data: Record<string, unknown> }> => {
    const outcome = await call.then((value) => ({ value }), (error: unknown) => ({ error }))
    if (!('error' in outcome)) throw new Error(`resolved as ${JSON.stringify(outcome.value)}`)
    expect(outcome.error).toBeInstanceOf(ProtocolError)
    return outcome.error as ProtocolError & { data: Record<string, unknown> }
  }

  it('serves unruled traffic unchanged: the handshake, tools/list and a tool no rule names', async () => {
    const client = await agent()
    const { tools } = await client.listTools()
    expect(tools.map((tool) => tool.name).sort()).toEqual(['create_ticket', 'search'])
    expect(text(await client.callTool({ name: 'search', arguments: { query: 'printer' } }))).toBe('results for printer')
  })

  it('refusals reach the SDK as a ProtocolError whose data.code is fencegate\'s: fence_required, then stale_fence for the agent whose lease was taken over', async () => {
    const client = await agent()
    const missing = await refused(client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-v2', title: 'x' } }))
    expect(missing.code).toBe(-32080)
    expect(missing.data).toMatchObject({ code: 'fence_required', status: 428 })
    await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-v2', title: 'agent 2' }, _meta: meta(2, 'v2-a2') })
    const stale = await refused(client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-v2', title: 'agent 1' }, _meta: meta(1, 'v2-a1') }))
    expect(stale.data).toMatchObject({ code: 'stale_fence', presented_fence: '1', highest_fence: '2' })
    expect(tickets.calls.filter((c) => c.ticket === 'T-v2')).toEqual([{ tool: 'create_ticket', ticket: 'T-v2', fence: '2' }])
  })

  for (const [answers, path] of [['event streams', '/mcp'], ['JSON answers', '/json/mcp']] as const) {
    it(`replays a keyed call to a retry with a new id, in ${answers}: one execution, the first result`, async () => {
      const ticket = `T-v2-replay-${path.length}`
      const call = async () => (await agent({}, path)).callTool({ name: 'create_ticket', arguments: { ticket_id: ticket, title: 'r' }, _meta: meta(1, `v2-${ticket}`) })
      const first = await call()
      expect(await call()).toEqual(first)
      expect(tickets.executions.get(ticket)).toBe(1)
    })
  }

  it('a key reused with other arguments: idempotency_key_reused', async () => {
    const client = await agent({ 'x-execution-fence': '1' })
    await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-v2-reuse', title: 'one' }, _meta: meta(undefined, 'v2-reuse') })
    const err = await refused(client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-v2-reuse', title: 'two' }, _meta: meta(undefined, 'v2-reuse') }))
    expect(err.data).toMatchObject({ code: 'idempotency_key_reused', status: 422 })
  })
})
