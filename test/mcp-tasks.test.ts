import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CreateTaskResultSchema, McpError } from '@modelcontextprotocol/sdk/types.js'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startTaskServer, type TaskServer } from './helpers/mcp-task-server.js'
import { ticketsRoute } from './helpers/mcp-ticket-server.js'

// The seeds' durable control calls (poll and cancel of a remote MCP task) must stop the moment
// the worker's claim moved on: a `method:` rule fences them per task, `task:{body.params.taskId}`,
// against the 1.x SDK's own task support on both ends.
describe.each(backends())('MCP control calls fenced per task with the official 1.x SDK, on $name', (backend) => {
  let t: TestDb
  let tasks: TaskServer
  let gw: TestGateway
  const clients: Client[] = []

  beforeAll(async () => {
    t = await backend.open()
    tasks = await startTaskServer()
    // The recipe's route (its tasks/cancel rule as written there), plus the poll fenced the same way.
    const route = ticketsRoute(tasks.url) as { mcp: Record<string, unknown>[] }
    const config = testConfig([{ ...route, mcp: [...route.mcp, { method: 'tasks/get', entity: 'task:{body.params.taskId}', fence: 'required' }] }])
    gw = await startTestGateway({ config, store: t.store })
  })
  afterAll(async () => {
    await Promise.all(clients.map((c) => c.close()))
    await gw?.close()
    await tasks?.close()
    await t?.close()
  })

  /** A worker of the task runtime: its MCP client through the gateway, its claim's fence on every request. */
  const worker = async (fence?: number) => {
    const client = new Client({ name: 'task-runtime', version: '1.0.0' })
    const headers: Record<string, string> = fence === undefined ? {} : { 'x-execution-fence': String(fence) }
    await client.connect(new StreamableHTTPClientTransport(new URL(`${gw.url}/mcp`), { requestInit: { headers } }))
    clients.push(client)
    return client
  }
  /** Starts a report as a task (an unruled tool: passed through) and returns its id. */
  const startReport = async (client: Client) => {
    const created = await client.request({ method: 'tools/call', params: { name: 'generate_report', arguments: { report_id: 'r' }, task: { ttl: 60_000 } } }, CreateTaskResultSchema)
    return created.task.taskId
  }
  const refused = async (call: Promise<unknown>): Promise<McpError & { data: Record<string, unknown> }> => {
    const outcome = await call.then((value) => ({ value }), (error: unknown) => ({ error }))
    if (!('error' in outcome)) throw new Error(`resolved as ${JSON.stringify(outcome.value)}`)
    expect(outcome.error).toBeInstanceOf(McpError)
    return outcome.error as McpError & { data: Record<string, unknown> }
  }
  const controlCalls = (taskId: string) => tasks.received.filter((r) => r.taskId === taskId).map(({ method, fence }) => ({ method, fence }))

  it('a control call without its fence is refused with fence_required in the SDK, and does not reach the server', async () => {
    const taskId = await startReport(await worker())
    const client = await worker()
    expect((await refused(client.experimental.tasks.cancelTask(taskId))).data).toMatchObject({ code: 'fence_required', status: 428 })
    expect((await refused(client.experimental.tasks.getTask(taskId))).data).toMatchObject({ code: 'fence_required' })
    expect(controlCalls(taskId)).toEqual([])
    expect((await tasks.store.getTask(taskId))?.status).toBe('working')
  })

  it('the seeds\' takeover: worker 1\'s claim moved to worker 2; worker 1\'s poll and cancel are stale_fence in the SDK, the server saw only worker 2\'s', async () => {
    const worker1 = await worker(1)
    const taskId = await startReport(worker1)
    expect((await worker1.experimental.tasks.getTask(taskId)).status).toBe('working')
    // Worker 1's claim expires while it is still running; worker 2 reclaims the task with fence 2 and polls it.
    const worker2 = await worker(2)
    expect((await worker2.experimental.tasks.getTask(taskId)).status).toBe('working')
    for (const call of [() => worker1.experimental.tasks.cancelTask(taskId), () => worker1.experimental.tasks.getTask(taskId)]) {
      const err = await refused(call())
      expect(err.code).toBe(-32080)
      expect(err.message).toMatch(/^MCP error -32080: stale_fence/)
      expect(err.data).toMatchObject({ code: 'stale_fence', status: 409, entity: `task:${taskId}`, presented_fence: '1', highest_fence: '2' })
    }
    // The stale cancel did not cancel the remote task: worker 2 still owns it, and cancels it.
    expect((await tasks.store.getTask(taskId))?.status).toBe('working')
    expect((await worker2.experimental.tasks.cancelTask(taskId)).status).toBe('cancelled')
    expect(controlCalls(taskId)).toEqual([
      { method: 'tasks/get', fence: '1' },
      { method: 'tasks/get', fence: '2' },
      { method: 'tasks/cancel', fence: '2' },
    ])
    const audit = await (await fetch(`${gw.adminUrl}/audit?route=tickets-mcp/tasks/cancel&code=stale_fence`)).json() as { items: { entity: string }[] }
    expect(audit.items.map((row) => row.entity)).toEqual([`task:${taskId}`])
  })
})
