import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import { silentLogger } from '../src/observe/log.js'
import { startRuleRegistry, type RuleRegistry } from '../src/rules/registry.js'
import { backends, type TestDb } from './helpers/backends.js'
import { startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startTicketServer, ticketsRoute, type TicketServer } from './helpers/mcp-ticket-server.js'
import { bearer, hmacAuthenticator, jwtAuth } from './helpers/tokens.js'

// Identity on an MCP route is the REST routes' (issue 42, "No way around a rule"): the MCP
// client's bearer token names the tenant, a rule's scopes are required of it, claimed_tenant
// is checked against it; and a route from the rules API is decided as one from the file.

const clients: Client[] = []
afterAll(async () => void await Promise.all(clients.map((c) => c.close())))

/** An agent's 1.x MCP client at `url`, its headers (a bearer token, a fence) set once on the transport. */
async function agent(url: string, headers: Record<string, string>): Promise<Client> {
  const client = new Client({ name: 'agent', version: '1.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }))
  clients.push(client)
  return client
}
async function refused(call: Promise<unknown>): Promise<McpError & { data: Record<string, unknown> }> {
  const outcome = await call.then((value) => ({ value }), (error: unknown) => ({ error }))
  if (!('error' in outcome)) throw new Error(`resolved as ${JSON.stringify(outcome.value)}`)
  expect(outcome.error).toBeInstanceOf(McpError)
  return outcome.error as McpError & { data: Record<string, unknown> }
}
const create = (client: Client, ticket: string, key: string, args: Record<string, string> = {}) =>
  client.callTool({ name: 'create_ticket', arguments: { ticket_id: ticket, title: 't', ...args }, _meta: { 'io.fencegate/fence': 1, 'io.fencegate/idempotency-key': key } })

describe.each(backends())('an MCP route under auth.mode: jwt, on $name', (backend) => {
  let t: TestDb
  let tickets: TicketServer
  let gw: TestGateway
  const write = { scope: 'tickets:write' }

  beforeAll(async () => {
    t = await backend.open()
    tickets = await startTicketServer()
    const route = ticketsRoute(tickets.url) as { mcp: Record<string, unknown>[] }
    const ruled = route.mcp.map((rule) => (rule.tool === 'create_ticket' ? { ...rule, scopes: ['tickets:write'] } : rule))
    const config = testConfig([{ ...route, mcp: ruled, claimed_tenant: 'body.params.arguments.tenant_id' }], { auth: jwtAuth })
    gw = await startTestGateway({ config, store: t.store, authenticate: await hmacAuthenticator() })
  })
  afterAll(async () => {
    await gw?.close()
    await tickets?.close()
    await t?.close()
  })

  it('the bearer token on the transport names the tenant: a key is one operation per tenant', async () => {
    const acme = await agent(`${gw.url}/mcp`, await bearer(write))
    const globex = await agent(`${gw.url}/mcp`, await bearer({ ...write, tenant_id: 'globex' }))
    const first = await create(acme, 'T-jwt', 'jwt-1')
    expect(await create(await agent(`${gw.url}/mcp`, await bearer(write)), 'T-jwt', 'jwt-1')).toEqual(first)
    // The same key from another tenant is another operation (and the same fence is another tenant's entity).
    expect(await create(globex, 'T-jwt', 'jwt-1')).not.toEqual(first)
    expect(tickets.executions.get('T-jwt')).toBe(2)
  })

  it('without a token, even initialize is refused: the SDK\'s connect fails, nothing reaches the server', async () => {
    const before = tickets.calls.length
    await expect(agent(`${gw.url}/mcp`, {})).rejects.toThrow(/unauthenticated|401/)
    expect(tickets.calls.length).toBe(before)
  })

  it('a rule\'s scopes: a token without tickets:write gets insufficient_scope as a JSON-RPC error the SDK reads; its unruled tools still work', async () => {
    const reader = await agent(`${gw.url}/mcp`, await bearer({ scope: 'tickets:read' }))
    const err = await refused(create(reader, 'T-scope', 'scope-1'))
    expect(err.code).toBe(-32080)
    expect(err.data).toMatchObject({ code: 'insufficient_scope', status: 403 })
    expect(err.message).toContain('tickets:write')
    expect(tickets.executions.get('T-scope')).toBeUndefined()
    expect((await reader.callTool({ name: 'search', arguments: { query: 'q' } })).content).toEqual([{ type: 'text', text: 'results for q' }])
  })

  it('claimed_tenant: a tool call naming another tenant than the token is tenant_mismatch; naming its own passes', async () => {
    const acme = await agent(`${gw.url}/mcp`, await bearer(write))
    const err = await refused(create(acme, 'T-claim', 'claim-1', { tenant_id: 'globex' }))
    expect(err.data).toMatchObject({ code: 'tenant_mismatch', status: 403 })
    expect(tickets.executions.get('T-claim')).toBeUndefined()
    await create(acme, 'T-claim', 'claim-2', { tenant_id: 'acme' })
    expect(tickets.executions.get('T-claim')).toBe(1)
    // The refusal's audit row is the token's tenant's, under the rule's name.
    const audit = await (await fetch(`${gw.adminUrl}/audit?code=tenant_mismatch`, { headers: await bearer({ scope: 'fencegate:admin' }) })).json() as { items: Record<string, unknown>[] }
    expect(audit.items).toMatchObject([{ tenant: 'acme', route: 'tickets-mcp/create_ticket', code: 'tenant_mismatch' }])
  })
})

describe.each(backends())('an MCP route created through the rules API, on $name', (backend) => {
  let t: TestDb
  let tickets: TicketServer
  let registry: RuleRegistry
  let gw: TestGateway

  beforeEach(async () => {
    t = await backend.open()
    tickets = await startTicketServer()
    // The file has one unrelated route (a configuration needs one); the MCP route comes from the API.
    const config = testConfig([{ name: 'other', method: 'POST', path: '/other', upstream: tickets.url, fence: 'off' }])
    registry = await startRuleRegistry({ db: t.db, config, log: silentLogger })
    gw = await startTestGateway({ config, store: t.store, rules: { registry, db: t.db } })
  })
  afterEach(async () => {
    await gw.close()
    await registry.close()
    await tickets.close()
    await t.close()
  })

  it('PUT /rules/tickets-mcp with the recipe\'s route: its GET and tools/list pass, a ruled tool is fenced and replayed, a stale fence refused in the SDK', async () => {
    const put = await fetch(`${gw.adminUrl}/rules/tickets-mcp`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ticketsRoute(tickets.url)) })
    expect(put.status).toBe(200)
    const client = await agent(`${gw.url}/mcp`, {})
    expect((await client.listTools()).tools.map((tool) => tool.name)).toContain('create_ticket')
    const first = await create(client, 'T-rules', 'rules-1')
    expect(await create(await agent(`${gw.url}/mcp`, {}), 'T-rules', 'rules-1')).toEqual(first)
    await client.callTool({ name: 'create_ticket', arguments: { ticket_id: 'T-rules', title: 't' }, _meta: { 'io.fencegate/fence': 2, 'io.fencegate/idempotency-key': 'rules-2' } })
    expect((await refused(create(client, 'T-rules', 'rules-3'))).data).toMatchObject({ code: 'stale_fence', presented_fence: '1', highest_fence: '2' })
    expect(tickets.executions.get('T-rules')).toBe(2)
    const audit = await (await fetch(`${gw.adminUrl}/audit?route=tickets-mcp/create_ticket&code=stale_fence`)).json() as { items: unknown[] }
    expect(audit.items).toHaveLength(1)
  })
})
