import { randomUUID } from 'node:crypto'
import { createServer, type IncomingMessage, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { InMemoryTaskStore } from '@modelcontextprotocol/sdk/experimental/tasks/stores/in-memory.js'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js'
import { z } from 'zod'

/** A JSON-RPC request as the task server received it: its method, the task it names and its fence header. */
export interface ReceivedControlCall {
  method: string
  taskId: string | undefined
  fence: string | undefined
}

/** A remote task runtime's MCP server (the seeds' poll and cancel), built with the official 1.x SDK's tasks. */
export interface TaskServer {
  url: string
  /** Every request that reached the server, in order. */
  received: ReceivedControlCall[]
  /** Where the server keeps its tasks: what a stale cancel must not have changed. */
  store: InMemoryTaskStore
  close(): Promise<void>
}

/**
 * The 1.x SDK's McpServer with its (experimental) task support: `generate_report` runs as a
 * task that stays `working` until cancelled, and the SDK's own `tasks/get` and `tasks/cancel`
 * handlers answer over an `InMemoryTaskStore`. Tasks are created without a session, so a second
 * agent (another session, another process) can poll and cancel them, as the seeds' durable task
 * runtime does after a worker's claim moved on. Sessions, event streams.
 *
 * @example const tasks = await startTaskServer(); // upstream: tasks.url
 */
export async function startTaskServer(): Promise<TaskServer> {
  const received: ReceivedControlCall[] = []
  const store = new InMemoryTaskStore()
  const sessions = new Map<string, StreamableHTTPServerTransport>()
  const mcpServer = () => {
    const server = new McpServer({ name: 'reports', version: '1.0.0' }, { capabilities: { tasks: { get: {}, cancel: {}, requests: { tools: { call: {} } } } }, taskStore: store })
    server.experimental.tasks.registerToolTask('generate_report', { inputSchema: { report_id: z.string() }, execution: { taskSupport: 'required' } }, {
      // The store itself, not the session-bound one: the task belongs to the runtime, not to one agent's session.
      createTask: async (_args, extra) => ({ task: await store.createTask({ ttl: 60_000 }, extra.requestId, { method: 'tools/call', params: {} }) }),
      getTask: async (_args, extra) => (await store.getTask(extra.taskId))!,
      getTaskResult: async (_args, extra) => await store.getTaskResult(extra.taskId) as { content: [] },
    })
    return server
  }
  const http: Server = createServer(async (req, res) => {
    const body = req.method === 'POST' ? JSON.parse(await text(req)) as unknown : undefined
    const message = body as { method?: string; params?: { taskId?: string } } | undefined
    if (message?.method) received.push({ method: message.method, taskId: message.params?.taskId, fence: req.headers['x-execution-fence'] as string | undefined })
    const sid = req.headers['mcp-session-id'] as string | undefined
    let transport = sid === undefined ? undefined : sessions.get(sid)
    if (!transport && req.method === 'POST' && isInitializeRequest(body)) {
      const fresh: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID(), onsessioninitialized: (id) => void sessions.set(id, fresh) })
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
    received,
    store,
    async close() {
      await Promise.all([...sessions.values()].map((t) => t.close()))
      store.cleanup()
      await new Promise<void>((resolve) => {
        http.close(() => resolve())
        http.closeAllConnections()
      })
    },
  }
}

async function text(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of req) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks).toString('utf8')
}
