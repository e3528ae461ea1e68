import { Client as ClientV1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport as TransportV1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpServer as McpServerV1 } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import { Client as ClientV2, StreamableHTTPClientTransport as TransportV2 } from '@modelcontextprotocol/client'
import { createMcpHandler, McpServer as McpServerV2 } from '@modelcontextprotocol/server'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { z } from 'zod'
import { parseConfig } from '../src/config/schema.js'
import { backends, type TestDb } from './helpers/backends.js'
import { startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { answerWith, listenOnLoopback, readBody } from './helpers/mcp-http.js'
import { startTicketServer, ticketsRoute, type TicketServer } from './helpers/mcp-ticket-server.js'

// `mcp_refusals: tool_error` (issue 42): a refused tools/call is the call's result, isError:
// true, fencegate's code in structuredContent.code, as both official SDK lines resolve it.

type ToolResult = { isError?: boolean; content: { type: string; text: string }[]; structuredContent?: Record<string, unknown> }
const meta = (fence?: number, key?: string) => ({
  ...(fence === undefined ? {} : { 'io.fencegate/fence': fence }),
  ...(key === undefined ? {} : { 'io.fencegate/idempotency-key': key }),
})

/** A 2.x server (stateless, 2026-07-28, JSON answers) with create_ticket; `/schema/...` has one with an outputSchema. */
async function startServers(): Promise<{ url: string; executions: string[]; versions: string[]; close(): Promise<void> }> {
  const executions: string[] = []
  const versions: string[] = []
  const v2 = createMcpHandler(() => {
    const server = new McpServerV2({ name: 'tickets-v2', version: '2.0.0' })
    server.registerTool('create_ticket', { inputSchema: z.object({ ticket_id: z.string(), title: z.string() }) }, async ({ ticket_id }) => {
      executions.push(ticket_id)
      return { content: [{ type: 'text', text: `created ${ticket_id}` }] }
    })
    return server
  }, { responseMode: 'json' })
  // The 1.x SDK's stateless server with a tool whose output has a schema (a new server per request, as its docs do).
  const v1Schema = () => {
    const server = new McpServerV1({ name: 'quotes', version: '1.0.0' })
    server.registerTool('create_ticket', { inputSchema: { ticket_id: z.string(), title: z.string() }, outputSchema: { ticket: z.string() } }, async ({ ticket_id }) => {
      executions.push(ticket_id)
      return { content: [{ type: 'text', text: ticket_id }], structuredContent: { ticket: ticket_id } }
    })
    return server
  }
  const server = await listenOnLoopback(async (req, res) => {
    const body = req.method === 'POST' ? await readBody(req) : undefined
    if (req.method === 'POST') versions.push(req.headers['mcp-protocol-version'] as string)
    if (req.url!.startsWith('/schema/')) {
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true })
      await v1Schema().connect(transport)
      await transport.handleRequest(req, res, body ? JSON.parse(body.toString('utf8')) : undefined)
      return
    }
    await answerWith(v2, req, res, body)
  }, () => v2.close())
  return { ...server, executions, versions }
}

describe.each(backends())('mcp_refusals: tool_error, on $name', (backend) => {
  let t: TestDb
  let tickets: TicketServer
  let servers: Awaited<ReturnType<typeof startServers>>
  let gw: TestGateway
  const closing: { close(): Promise<void> }[] = []

  beforeAll(async () => {
    t = await backend.open()
    tickets = await startTicketServer()
    servers = await startServers()
    const toolErrors = (route: Record<string, unknown>) => ({ ...route, mcp_refusals: 'tool_error' })
    gw = await startTestGateway({
      config: testConfig([
        toolErrors(ticketsRoute(tickets.url)),
        toolErrors(ticketsRoute(servers.url, '/v2/mcp', 'tickets-v2')),
        toolErrors(ticketsRoute(servers.url, '/schema/mcp', 'tickets-schema')),
      ]),
      store: t.store,
    })
  })
  afterAll(async () => {
    await Promise.all(closing.map((c) => c.close()))
    await gw?.close()
    await servers?.close()
    await tickets?.close()
    await t?.close()
  })

  const v1 = async (path = '/mcp') => {
    const client = new ClientV1({ name: 'agent', version: '1.0.0' })
    await client.connect(new TransportV1(new URL(`${gw.url}${path}`)))
    closing.push(client)
    return client
  }
  const v2 = async () => {
    // Pinned: the 2.x client's default negotiation is 'legacy' (initialize, 2025-11-25).
    const client = new ClientV2({ name: 'agent', version: '2.0.0' }, { versionNegotiation: { mode: { pin: '2026-07-28' } } })
    await client.connect(new TransportV2(new URL(`${gw.url}/v2/mcp`)))
    closing.push(client)
    return client
  }
  const expectToolError = (result: unknown, code: string) => {
    const r = result as ToolResult
    expect(r.isError).toBe(true)
    expect(r.structuredContent).toMatchObject({ code, type: `urn:fencegate:problem:${code}` })
    expect(r.content).toEqual([{ type: 'text', text: expect.stringMatching(new RegExp(`^${code}: `)) }])
    return r.structuredContent!
  }

  it('the 1.x SDK (sessions, 2025-11-25): callTool resolves with isError and the code, for a missing and for a stale fence; nothing reaches the server', async () => {
    const client = await v1()
    expectToolError(await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-te1', title: 'x' } }), 'fence_required')
    await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-te1', title: 'agent 2' }, _meta: meta(2, 'te1-a2') })
    const stale = expectToolError(await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-te1', title: 'agent 1' }, _meta: meta(1, 'te1-a1') }), 'stale_fence')
    expect(stale).toMatchObject({ status: 409, entity: 'ticket:T-te1', presented_fence: '1', highest_fence: '2' })
    expect(tickets.calls.filter((c) => c.ticket === 'T-te1')).toEqual([{ tool: 'create_ticket', ticket: 'T-te1', fence: '2' }])
  })

  it('the 2.x SDK (stateless, 2026-07-28): callTool resolves with isError and the code; the answer carries resultType "complete"', async () => {
    const client = await v2()
    servers.versions.length = 0
    expectToolError(await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-te2', title: 'x' } }), 'fence_required')
    await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-te2', title: 'one' }, _meta: meta(1, 'te2') })
    expectToolError(await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-te2', title: 'two' }, _meta: meta(1, 'te2') }), 'idempotency_key_reused')
    expect(servers.executions.filter((id) => id === 'T-te2')).toEqual(['T-te2'])
    expect(servers.versions).toEqual(['2026-07-28'])
    const raw = async (version: string) => await (await fetch(`${gw.url}/v2/mcp`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': version },
      body: JSON.stringify({ jsonrpc: '2.0', id: 'r1', method: 'tools/call', params: { name: 'create_ticket', arguments: { ticket_id: 'T-te2', title: 'x' } } }),
    })).json() as Promise<{ id: string; result: Record<string, unknown> }>
    expect(await raw('2026-07-28')).toMatchObject({ id: 'r1', result: { isError: true, resultType: 'complete', structuredContent: { code: 'fence_required' } } })
    expect((await raw('2025-11-25')).result).not.toHaveProperty('resultType')
  })

  it('what is not one well-formed call stays a JSON-RPC error, and so does a refused method rule', async () => {
    const post = async (body: unknown, headers: Record<string, string> = {}) => await (await fetch(`${gw.url}/mcp`, {
      method: 'POST', body: JSON.stringify(body), headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
    })).json() as Promise<{ result?: unknown; error?: { code: number; data: { code: string } } }>
    const call = { jsonrpc: '2.0', id: 'm1', method: 'tools/call', params: { name: 'create_ticket', arguments: { ticket_id: 'T-te3', title: 't' } } }
    expect(await post(call, { 'mcp-name': 'search' })).toMatchObject({ error: { code: -32600, data: { code: 'invalid_request' } } })
    expect(await post({ jsonrpc: '2.0', id: 'm2', method: 'tasks/cancel', params: { taskId: 'x' } })).toMatchObject({ error: { code: -32080, data: { code: 'fence_required' } } })
  })

  it('a tool with an outputSchema: the 1.x SDK (1.32.2) checks an error result\'s structuredContent against it and rejects the call; the 2.x SDK does not', async () => {
    const client = await v1('/schema/mcp')
    await client.listTools() // the 1.x client learns the output schemas from tools/list
    const outcome = await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-te4', title: 'x' } }).then((value) => ({ value }), (error: unknown) => ({ error }))
    expect('error' in outcome && outcome.error).toBeInstanceOf(McpError)
    const err = (outcome as { error: McpError }).error
    expect(err.code).toBe(-32602)
    expect(err.message).toMatch(/Structured content does not match the tool's output schema/)
    expect(servers.executions).not.toContain('T-te4')
  })
})

describe('the mcp_refusals setting', () => {
  const base = { name: 'm', method: 'POST', path: '/mcp', upstream: 'http://127.0.0.1:9100', fence: 'off' }
  const problems = (route: Record<string, unknown>) => {
    try {
      parseConfig({ routes: [route] })
      return ''
    } catch (err) {
      return (err as { problems: string[] }).problems.join('\n')
    }
  }
  it.each([
    [{ ...base, mcp_refusals: 'tool_error' }, /mcp_refusals: applies to an MCP route only/],
    [{ ...base, mcp: [{ method: 'tasks/cancel', mcp_refusals: 'tool_error' }] }, /mcp\[0\]\.mcp_refusals: tool_error answers a tool's refusal/],
    [{ ...base, mcp_refusals: 'result', mcp: [{ tool: 'a' }] }, /mcp_refusals/],
  ])('refuses %j', (route, message) => {
    expect(problems(route)).toMatch(message)
  })

  it('is the route\'s unless a tool\'s rule sets it', () => {
    const config = parseConfig({ routes: [{ ...base, mcp: [{ tool: 'a' }, { tool: 'b', mcp_refusals: 'tool_error' }] }] })
    expect(config.routes[0]!.mcp_refusals).toBe('protocol_error')
    expect(config.routes[0]!.mcp![1]!.mcp_refusals).toBe('tool_error')
  })
})
