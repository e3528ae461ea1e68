// The MCP server of the MCP cases: the official 2.x SDK's `createMcpHandler` (stateless,
// protocol 2026-07-28, JSON answers) behind node:http, one tool, `capture_payment`, answering
// at once. Run as its own process (`node mcp-server.js`), so its CPU is counted apart from the
// gateway's; it prints {"port":N} when listening.
import { createServer, type IncomingMessage } from 'node:http'
import { createMcpHandler, McpServer } from '@modelcontextprotocol/server'
import { z } from 'zod'
import { serveUntilParentGoes } from './child.js'
import { mcpTool } from './traffic.js'

const handler = createMcpHandler(() => {
  const server = new McpServer({ name: 'bench-payments', version: '1.0.0' })
  server.registerTool(mcpTool, { inputSchema: z.object({ invoice_id: z.string(), amount: z.number(), currency: z.string() }) }, async ({ invoice_id }) => (
    { content: [{ type: 'text', text: `captured ${invoice_id}` }] }
  ))
  return server
}, { responseMode: 'json' })

async function bytes(req: IncomingMessage): Promise<Uint8Array<ArrayBuffer>> {
  const chunks: Buffer[] = []
  for await (const chunk of req) chunks.push(chunk as Buffer)
  return new Uint8Array(Buffer.concat(chunks))
}

// node:http to the Fetch API and back, as an MCP server on Node without a framework adapter does.
const server = createServer((req, res) => {
  void (async () => {
    const headers = new Headers()
    for (const [name, value] of Object.entries(req.headers)) if (typeof value === 'string') headers.set(name, value)
    const body = req.method === 'POST' ? await bytes(req) : undefined
    const answer = await handler.fetch(new Request(`http://127.0.0.1${req.url}`, { method: req.method!, headers, ...(body ? { body } : {}) }))
    const out = new Uint8Array(await answer.arrayBuffer())
    res.writeHead(answer.status, { ...Object.fromEntries(answer.headers), 'content-length': out.length })
    res.end(out)
  })().catch(() => {
    if (!res.headersSent) res.writeHead(500)
    res.end()
  })
})
// Longer than any gap between cases, so pooled connections are reused, not redialled.
server.keepAliveTimeout = 120_000
serveUntilParentGoes(server, () => handler.close())
