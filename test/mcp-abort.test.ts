import { Client, ProtocolError, StreamableHTTPClientTransport } from '@modelcontextprotocol/client'
import { createMcpHandler, McpServer } from '@modelcontextprotocol/server'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { z } from 'zod'
import { backends, type TestDb } from './helpers/backends.js'
import { startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { answerWith, listenOnLoopback, readBody } from './helpers/mcp-http.js'
import { ticketsRoute } from './helpers/mcp-ticket-server.js'

// On 2026-07-28 a client cancels a call by closing its stream; the 2.x SDK's callTool does that
// when its AbortSignal fires. That must not turn one operation into two (issue 42, "Replay in
// MCP's terms"): the retry with the same key gets the stored answer, or outcome_unknown /
// request_in_progress as on REST routes, and the server executes the tool once.

/** A promise and its resolve (Promise.withResolvers is not in Node 20). */
function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void
  const promise = new Promise<void>((r) => { resolve = r })
  return { promise, resolve }
}

/** A 2.x createMcpHandler server (event streams) whose create_ticket holds until the test lets it finish. */
async function startHeldServer() {
  const executions = new Map<string, number>()
  // Per ticket: when its call started executing, and what lets it finish.
  const gates = new Map<string, { started: ReturnType<typeof deferred>; release: ReturnType<typeof deferred> }>()
  const gate = (ticket: string) => gates.get(ticket) ?? gates.set(ticket, { started: deferred(), release: deferred() }).get(ticket)!
  const handler = createMcpHandler(() => {
    const server = new McpServer({ name: 'held-tickets', version: '2.0.0' })
    server.registerTool('create_ticket', { inputSchema: z.object({ ticket_id: z.string(), title: z.string() }) }, async ({ ticket_id }) => {
      executions.set(ticket_id, (executions.get(ticket_id) ?? 0) + 1)
      gate(ticket_id).started.resolve()
      await gate(ticket_id).release.promise
      return { content: [{ type: 'text', text: `created ${ticket_id}` }] }
    })
    return server
  }, { responseMode: 'sse' })
  // The gateway leaving the upstream request is the server's cancellation.
  const server = await listenOnLoopback(async (req, res) => answerWith(handler, req, res, req.method === 'POST' ? await readBody(req) : undefined, true), async () => {
    for (const { release } of gates.values()) release.resolve()
    await handler.close()
  })
  return {
    ...server,
    executions,
    started: (ticket: string) => gate(ticket).started.promise,
    release: (ticket: string) => gate(ticket).release.resolve(),
  }
}

describe.each(backends())('a 2.x client that cancels a keyed call mid-stream, on $name', (backend) => {
  let t: TestDb
  let server: Awaited<ReturnType<typeof startHeldServer>>
  let gw: TestGateway
  const clients: Client[] = []

  beforeAll(async () => {
    t = await backend.open()
    server = await startHeldServer()
    // /mcp waits 5 s for the server; /short/mcp gives up after 1 s, so an answer that never comes is an unknown outcome soon.
    const routes = [ticketsRoute(server.url), { ...ticketsRoute(server.url, '/short/mcp', 'tickets-short'), timeout_ms: 1000 }]
    gw = await startTestGateway({ config: testConfig(routes), store: t.store })
  })
  afterAll(async () => {
    await Promise.all(clients.map((c) => c.close()))
    await gw?.close()
    await server?.close()
    await t?.close()
  })

  /** A new agent process's client (a retry after a crash has a new id and no session), calling create_ticket with one key. */
  const call = async (path: string, ticket: string, signal?: AbortSignal) => {
    const client = new Client({ name: 'agent', version: '2.0.0' })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}${path}`)))
    clients.push(client)
    const meta = { 'io.fencegate/fence': 1, 'io.fencegate/idempotency-key': `key-${ticket}` }
    return client.callTool({ name: 'create_ticket', arguments: { ticket_id: ticket, title: 'a' }, _meta: meta }, signal ? { signal } : {})
  }
  /** What a call got: its result, or fencegate's code from the SDK's error. */
  const outcome = (p: Promise<unknown>) => p.then(
    (result) => ({ result }),
    (error: unknown) => {
      expect(error).toBeInstanceOf(ProtocolError)
      return { code: (error as ProtocolError & { data: { code: string } }).data.code }
    },
  )
  /** Starts a keyed call, waits until the server executes it, and aborts it: the client closes its stream. */
  const abortMidCall = async (path: string, ticket: string) => {
    const controller = new AbortController()
    const first = call(path, ticket, controller.signal)
    await server.started(ticket)
    controller.abort()
    await expect(first).rejects.toThrow()
  }

  it('the server finishes after the client left: the gateway stored its answer, and the retry gets it without a second execution', async () => {
    await abortMidCall('/mcp', 'T-left')
    server.release('T-left')
    // The retry may arrive while the gateway still reads the first answer: it waits for that outcome.
    const retry = await outcome(call('/mcp', 'T-left'))
    expect(retry).toEqual({ result: { content: [{ type: 'text', text: 'created T-left' }] } })
    expect(await outcome(call('/mcp', 'T-left'))).toEqual(retry)
    expect(server.executions.get('T-left')).toBe(1)
  })

  it('the server never answers within the route\'s timeout: the retry gets outcome_unknown (or request_in_progress before that), never a second execution', async () => {
    await abortMidCall('/short/mcp', 'T-lost')
    const during = await outcome(call('/short/mcp', 'T-lost'))
    expect(['outcome_unknown', 'request_in_progress']).toContain((during as { code?: string }).code)
    // Settled: every retry is told the outcome is unknown, and the key never executes again.
    const settled = await vi.waitFor(async () => {
      const after = await outcome(call('/short/mcp', 'T-lost'))
      expect(after).toEqual({ code: 'outcome_unknown' })
      return after
    }, { timeout: 10_000, interval: 50 })
    server.release('T-lost')
    expect(await outcome(call('/short/mcp', 'T-lost'))).toEqual(settled)
    expect(server.executions.get('T-lost')).toBe(1)
  })
})
