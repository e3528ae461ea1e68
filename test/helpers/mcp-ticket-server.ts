import { randomUUID } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { createServer, type IncomingMessage, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js'
import { parse } from 'yaml'
import { z } from 'zod'

/** A `tools/call` as the ticket server received it: the tool, its ticket and the fence header it came with. */
export interface ReceivedCall {
  tool: string
  ticket: string | undefined
  fence: string | undefined
}

/** A ticket system's MCP server, built with the official 1.x SDK, and what reached it. */
export interface TicketServer {
  url: string
  /** Every tools/call that reached the server, in order. */
  calls: ReceivedCall[]
  /** Tool executions by ticket id (create_ticket) — what a duplicate must not add to. */
  executions: Map<string, number>
  close(): Promise<void>
}

/**
 * The 1.x SDK's McpServer behind StreamableHTTPServerTransport with sessions, on a real
 * `node:http` server: `/mcp` answers in event streams (the SDK's default), `/json/mcp` with
 * `enableJsonResponse: true`. Tools: `create_ticket` and `add_comment` (ruled in the tests),
 * `search` (unruled).
 *
 * @example const tickets = await startTicketServer(); // upstream: tickets.url
 */
export async function startTicketServer(): Promise<TicketServer> {
  const calls: ReceivedCall[] = []
  const executions = new Map<string, number>()
  const sessions = new Map<string, StreamableHTTPServerTransport>()
  let created = 0
  const mcpServer = () => {
    const server = new McpServer({ name: 'tickets', version: '1.0.0' })
    server.registerTool('create_ticket', { description: 'Open a ticket', inputSchema: { ticket_id: z.string(), title: z.string() } }, async ({ ticket_id, title }) => {
      executions.set(ticket_id, (executions.get(ticket_id) ?? 0) + 1)
      return { content: [{ type: 'text', text: `created ${ticket_id} (${title}) #${++created}` }] }
    })
    server.registerTool('add_comment', { description: 'Comment on a ticket', inputSchema: { ticket_id: z.string(), comment_id: z.string(), text: z.string() } }, async ({ ticket_id, comment_id }) => (
      { content: [{ type: 'text', text: `comment ${comment_id} on ${ticket_id} #${++created}` }] }
    ))
    server.registerTool('search', { description: 'Search tickets', inputSchema: { query: z.string() } }, async ({ query }) => ({ content: [{ type: 'text', text: `results for ${query}` }] }))
    return server
  }
  const http: Server = createServer(async (req, res) => {
    const json = req.url?.startsWith('/json/') === true
    const body = req.method === 'POST' ? JSON.parse(await text(req)) as unknown : undefined
    record(body, req, calls)
    const sid = req.headers['mcp-session-id'] as string | undefined
    let transport = sid === undefined ? undefined : sessions.get(sid)
    if (!transport && req.method === 'POST' && isInitializeRequest(body)) {
      const fresh: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        enableJsonResponse: json,
        onsessioninitialized: (id) => void sessions.set(id, fresh),
      })
      await mcpServer().connect(fresh)
      transport = fresh
    }
    if (!transport) {
      res.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: 'no session' } }))
      return
    }
    await transport.handleRequest(req, res, body)
  })
  await new Promise<void>((resolve) => http.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${(http.address() as AddressInfo).port}`,
    calls,
    executions,
    async close() {
      await Promise.all([...sessions.values()].map((t) => t.close()))
      await new Promise<void>((resolve) => {
        http.close(() => resolve())
        http.closeAllConnections()
      })
    },
  }
}

function record(body: unknown, req: IncomingMessage, calls: ReceivedCall[]): void {
  const message = body as { method?: string; params?: { name?: string; arguments?: { ticket_id?: string } } } | undefined
  if (message?.method !== 'tools/call') return
  calls.push({ tool: message.params!.name!, ticket: message.params!.arguments?.ticket_id, fence: req.headers['x-execution-fence'] as string | undefined })
}

async function text(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of req) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks).toString('utf8')
}

/** The route of docs/recipes/mcp.md, read from its YAML, at `path` and pointed at `upstream`. */
export function ticketsRoute(upstream: string, path = '/mcp', name = 'tickets-mcp'): Record<string, unknown> {
  const doc = readFileSync(new URL('../../docs/recipes/mcp.md', import.meta.url), 'utf8')
  const route = (parse(/```yaml\n([\s\S]*?)```/.exec(doc)![1]!) as { routes: Record<string, unknown>[] }).routes[0]!
  return { ...route, name, path, upstream }
}
