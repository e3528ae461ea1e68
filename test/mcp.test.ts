import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startTicketServer, ticketsRoute, type TicketServer } from './helpers/mcp-ticket-server.js'

/** A call's `_meta` with fencegate's fence and key, as an agent framework sets per-call metadata. */
const meta = (fence?: string | number, key?: string) => ({
  ...(fence === undefined ? {} : { 'io.fencegate/fence': fence }),
  ...(key === undefined ? {} : { 'io.fencegate/idempotency-key': key }),
})
const text = (result: unknown) => (result as { content: { text: string }[] }).content[0]!.text

describe.each(backends())('MCP through fencegate with the official 1.x SDK (sessions), on $name', (backend) => {
  let t: TestDb
  let tickets: TicketServer
  let gw: TestGateway
  const clients: Client[] = []

  beforeAll(async () => {
    t = await backend.open()
    tickets = await startTicketServer()
    gw = await startTestGateway({ config: testConfig([ticketsRoute(tickets.url), ticketsRoute(tickets.url, '/json/mcp', 'tickets-json')]), store: t.store })
  })
  afterAll(async () => {
    await Promise.all(clients.map((c) => c.close()))
    await gw?.close()
    await tickets?.close()
    await t?.close()
  })

  /** An agent's MCP client through the gateway (`/mcp`: event streams; `/json/mcp`: JSON answers). */
  const agent = async (headers: Record<string, string> = {}, path = '/mcp') => {
    const client = new Client({ name: 'agent', version: '1.0.0' })
    await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}${path}`), { requestInit: { headers } }))
    clients.push(client)
    return client
  }
  /** The McpError a call rejected with; fails the test if it resolved. */
  const refused = async (call: Promise<unknown>): Promise<McpError & { data: Record<string, unknown> }> => {
    const outcome = await call.then((value) => ({ value }), (error: unknown) => ({ error }))
    if (!('error' in outcome)) throw new Error(`resolved as ${JSON.stringify(outcome.value)}`)
    expect(outcome.error).toBeInstanceOf(McpError)
    return outcome.error as McpError & { data: Record<string, unknown> }
  }

  it('serves unruled traffic unchanged: initialize, tools/list and a tool no rule names', async () => {
    const client = await agent()
    expect(client.getServerVersion()).toMatchObject({ name: 'tickets' })
    const { tools } = await client.listTools()
    expect(tools.map((tool) => tool.name).sort()).toEqual(['add_comment', 'create_ticket', 'search'])
    expect(text(await client.callTool({ name: 'search', arguments: { query: 'printer' } }))).toBe('results for printer')
  })

  it('a ruled tool requires its fence: the SDK rejects with an McpError whose data.code is fence_required, and nothing reaches the server', async () => {
    const client = await agent()
    const err = await refused(client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-nofence', title: 'x' } }))
    expect(err.code).toBe(-32080)
    expect(err.data).toMatchObject({ code: 'fence_required', status: 428 })
    expect(err.message).toContain('fence_required')
    expect(tickets.calls.filter((c) => c.ticket === 'T-nofence')).toEqual([])
  })

  it('the seeds\' agents: after agent 2 took over with a higher fence, agent 1 keeps calling create_ticket with its old one; the server sees only agent 2, agent 1 sees stale_fence', async () => {
    const agent1 = await agent({ 'x-execution-fence': '1' })
    const agent2 = await agent({ 'x-execution-fence': '2' })
    expect(text(await agent1.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-lease', title: 'a1' }, _meta: meta(undefined, 'a1-1') }))).toMatch(/^created T-lease/)
    // Agent 1's lease expires; agent 2 takes over with fence 2 and works on.
    const before = tickets.calls.length
    await agent2.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-lease', title: 'a2' }, _meta: meta(undefined, 'a2-1') })
    for (const key of ['a1-2', 'a1-3']) {
      const err = await refused(agent1.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-lease', title: 'a1 again' }, _meta: meta(undefined, key) }))
      expect(err.data).toMatchObject({ code: 'stale_fence', status: 409, entity: 'ticket:T-lease', presented_fence: '1', highest_fence: '2' })
    }
    await agent2.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-lease', title: 'a2 again' }, _meta: meta(undefined, 'a2-2') })
    expect(tickets.calls.slice(before)).toEqual([
      { tool: 'create_ticket', ticket: 'T-lease', fence: '2' },
      { tool: 'create_ticket', ticket: 'T-lease', fence: '2' },
    ])
    // The audit trail names the tool, and is queried by it.
    const audit = await (await fetch(`${gw.adminUrl}/audit?route=tickets-mcp/create_ticket&code=stale_fence`)).json() as { items: { entity: string }[] }
    expect(audit.items.map((row) => row.entity)).toEqual(['ticket:T-lease', 'ticket:T-lease'])
  })

  it('takes the fence and key from params._meta; a header and _meta that disagree are refused with 400 codes', async () => {
    const client = await agent()
    // The fence as a decimal string here; as a number elsewhere.
    expect(text(await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-meta', title: 'm' }, _meta: meta('7', 'meta-1') }))).toMatch(/^created T-meta/)
    expect(tickets.calls.at(-1)).toEqual({ tool: 'create_ticket', ticket: 'T-meta', fence: '7' })
    const fenced = await agent({ 'x-execution-fence': '8' })
    const fence = await refused(fenced.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-meta', title: 'm' }, _meta: meta(9, 'meta-2') }))
    expect(fence.data).toMatchObject({ code: 'invalid_fence', status: 400 })
    const keyed = await agent({ 'x-execution-fence': '8', 'idempotency-key': 'meta-3' })
    const key = await refused(keyed.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-meta', title: 'm' }, _meta: meta(8, 'meta-4') }))
    expect(key.data).toMatchObject({ code: 'invalid_idempotency_key', status: 400 })
    expect(tickets.executions.get('T-meta')).toBe(1)
  })

  for (const [answers, path] of [['event streams', '/mcp'], ['JSON answers', '/json/mcp']] as const) {
    it(`replays a keyed call to a retry with a new id, in ${answers}: one execution, the first result`, async () => {
      const ticket = `T-replay-${path.length}`
      const first = await (await agent({}, path)).callTool({ name: 'create_ticket', arguments: { ticket_id: ticket, title: 'r' }, _meta: meta(1, `replay-${ticket}`) })
      // Another session of another process of the agent, after a crash: a new id, a new session.
      const again = await (await agent({}, path)).callTool({ name: 'create_ticket', arguments: { ticket_id: ticket, title: 'r' }, _meta: meta(1, `replay-${ticket}`) })
      expect(again).toEqual(first)
      expect(tickets.executions.get(ticket)).toBe(1)
    })
  }

  it('a key reused with other arguments is idempotency_key_reused; with idempotency_payload: key, the first answer', async () => {
    const client = await agent({ 'x-execution-fence': '1' })
    await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-reuse', title: 'one' }, _meta: meta(undefined, 'reuse-1') })
    const err = await refused(client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-reuse', title: 'two' }, _meta: meta(undefined, 'reuse-1') }))
    expect(err.data).toMatchObject({ code: 'idempotency_key_reused', status: 422 })
    const comment = (words: string) => client.callTool({ name: 'add_comment', arguments: { ticket_id: 'T-reuse', comment_id: 'c1', text: words } })
    const firstComment = await comment('first words')
    expect(await comment('other words')).toEqual(firstComment)
    expect(tickets.calls.filter((c) => c.tool === 'add_comment' && c.ticket === 'T-reuse')).toHaveLength(1)
  })

  it('concurrent duplicates execute once, and each gets the one result', async () => {
    const client = await agent({ 'x-execution-fence': '1' })
    const results = await Promise.all(Array.from({ length: 8 }, () =>
      client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-storm', title: 's' }, _meta: meta(undefined, 'storm') })))
    expect(new Set(results.map(text)).size).toBe(1)
    expect(tickets.executions.get('T-storm')).toBe(1)
  })
})
