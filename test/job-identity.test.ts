import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createJobStore } from '../src/leases/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { hmacAuthenticator, jwtAuth, token } from './helpers/tokens.js'

/**
 * The job API trusts tokens, not bodies: each verb needs its scope, and the worker is the
 * token's `sub`. Before, any token of a tenant could start, claim, complete, fail, release
 * or cancel any job of that tenant, and `worker_id` was whatever the body said.
 */
describe.each(backends())('the job API under auth on $name', (backend) => {
  let t: TestDb
  let gw: TestGateway

  beforeAll(async () => {
    t = await backend.open()
    gw = await startTestGateway({
      config: testConfig([route('http://127.0.0.1:9')], { auth: jwtAuth, job_types: [{ name: 'report', lease: '45s' }, { name: 'scoped', lease: '45s' }, { name: 'named', lease: '45s' }] }),
      store: t.store, jobs: createJobStore(t.db), authenticate: await hmacAuthenticator(),
    })
  })
  afterAll(async () => {
    await gw.close()
    await t.close()
  })

  const call = async (path: string, claims: Record<string, unknown>, body?: unknown, method = 'POST') => {
    const res = await fetch(`${gw.url}/_fencegate/jobs${path}`, {
      method, headers: { 'content-type': 'application/json', authorization: `Bearer ${await token(claims)}` }, ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    })
    const text = await res.text()
    return { status: res.status, json: text ? JSON.parse(text) : undefined }
  }
  const starter = { sub: 'scheduler', scope: 'jobs:start' }
  const workerA = { sub: 'host-a', scope: 'jobs:work jobs:read' }
  const workerB = { sub: 'host-b', scope: 'jobs:work jobs:read' }

  it('each verb needs its scope; fencegate:admin has them all; refusals change nothing and are audited', async () => {
    expect((await call('', { sub: 'browser', scope: 'jobs:read' }, { type: 'report', key: 'k1' })).json.code).toBe('insufficient_scope')
    const started = await call('', starter, { type: 'report', key: 'k1' })
    expect(started.status).toBe(201)
    expect((await call(`/${started.json.job_id}`, starter, undefined, 'GET')).json.code).toBe('insufficient_scope')
    expect((await call('/claim', starter, {})).json.code).toBe('insufficient_scope')
    expect((await call(`/${started.json.job_id}/cancel`, workerA)).json.code).toBe('insufficient_scope')
    expect((await call(`/${started.json.job_id}`, workerA, undefined, 'GET')).json.state).toBe('queued')
    expect((await call(`/${started.json.job_id}/cancel`, { sub: 'ops', scope: 'fencegate:admin' })).status).toBe(200)
    const rows = await t.store.listAudit({ tenant: 'acme', code: 'insufficient_scope', limit: 10 })
    expect(rows.length).toBe(4)
  })

  it("a worker's token cannot touch another worker's lease, even with its fence; slots of one sub share it", async () => {
    const { json: job } = await call('', starter, { type: 'report', key: 'k2' })
    const claimed = await call('/claim', workerA, {})
    expect(claimed.json).toMatchObject({ job_id: job.job_id, fence: '1' })
    const held = { worker_id: 'host-a', fence: claimed.json.fence }
    for (const [verb, body] of [['heartbeat', held], ['append', { ...held, seq: 0, chunk: 'x' }], ['complete', { ...held, result: 1 }], ['fail', { ...held, retryable: false }], ['release', held]] as const) {
      const res = await call(`/${job.job_id}/${verb}`, workerB, body)
      expect([res.status, res.json.code], verb).toEqual([403, 'worker_mismatch'])
    }
    // Naming itself as the holder is no way round: B is not host-a.
    expect((await call('/claim', workerB, { worker_id: 'host-a' })).json.code).toBe('worker_mismatch')
    const after = await call(`/${job.job_id}`, workerA, undefined, 'GET')
    expect(after.json).toMatchObject({ state: 'running', fence: '1', owner: 'host-a' })
    // A slot of host-a is host-a's: it may not renew a lease held as plain host-a, but it is not refused as another worker.
    expect((await call(`/${job.job_id}/heartbeat`, workerA, { worker_id: 'host-a/slot-2', fence: '1' })).json.code).toBe('lease_lost')
    expect((await call(`/${job.job_id}/complete`, workerA, { ...held, result: 1 })).status).toBe(200)
    expect((await t.store.listAudit({ tenant: 'acme', code: 'worker_mismatch', limit: 10 })).length).toBe(6)
  })

  // One row per verb: the token holds every job scope but the one the verb needs, so only the scope check can refuse it.
  const allBut = (scope: string) => ['jobs:start', 'jobs:work', 'jobs:cancel', 'jobs:read'].filter((s) => s !== scope).join(' ')
  const scopeTable = (running: string) => {
    const held = { worker_id: 'host-a', fence: '1' }
    return [
      ['start', 'jobs:start', 'POST', '', { type: 'scoped', key: 'never' }],
      ['bulk start', 'jobs:start', 'POST', '/bulk', { jobs: [{ type: 'scoped', key: 'never-1' }, { type: 'scoped', key: 'never-2' }] }],
      ['restart', 'jobs:start', 'POST', '', { type: 'scoped', key: 'cancelled', restart: true }],
      ['claim', 'jobs:work', 'POST', '/claim', { types: ['scoped'] }],
      ['GET', 'jobs:read', 'GET', `/${running}`, undefined],
      ['HEAD', 'jobs:read', 'HEAD', `/${running}`, undefined],
      ['heartbeat', 'jobs:work', 'POST', `/${running}/heartbeat`, held],
      ['append', 'jobs:work', 'POST', `/${running}/append`, { ...held, seq: 0, chunk: 'x' }],
      ['complete', 'jobs:work', 'POST', `/${running}/complete`, { ...held, result: 1 }],
      ['fail', 'jobs:work', 'POST', `/${running}/fail`, { ...held, retryable: false }],
      ['release', 'jobs:work', 'POST', `/${running}/release`, held],
      ['cancel', 'jobs:cancel', 'POST', `/${running}/cancel`, undefined],
    ] as const
  }
  const scopedJobs = async () => t.db.sql`
    SELECT id::text, key, state, fence::text, attempt, owner, lease_until::text, cancel_requested, cursor_length, result, error
    FROM fg_jobs WHERE tenant = 'acme' AND type = 'scoped' ORDER BY id`

  it('every verb without its scope: 403 insufficient_scope, audited with its method and path, and no job changed', async () => {
    const cancelled = (await call('', starter, { type: 'scoped', key: 'cancelled' })).json.job_id
    expect((await call(`/${cancelled}/cancel`, { sub: 'ops', scope: 'jobs:cancel' })).json.state).toBe('cancelled')
    const running = (await call('', starter, { type: 'scoped', key: 'running' })).json.job_id
    expect((await call('/claim', workerA, { types: ['scoped'] })).json).toMatchObject({ job_id: running, fence: '1', worker_id: 'host-a' })
    await call('', starter, { type: 'scoped', key: 'queued' })
    const before = await scopedJobs()
    const audited = (await t.store.listAudit({ tenant: 'acme', code: 'insufficient_scope', limit: 100 })).length
    const table = scopeTable(running)
    for (const [verb, scope, method, path, body] of table) {
      const res = await call(path, { sub: 'host-a', scope: allBut(scope) }, body, method)
      // HEAD has no body to carry the code; its status is the refusal.
      expect(method === 'HEAD' ? [res.status] : [res.status, res.json.code], verb).toEqual(method === 'HEAD' ? [403] : [403, 'insufficient_scope'])
    }
    expect(await scopedJobs()).toEqual(before)
    expect(await t.db.sql`SELECT count(*)::int AS n FROM fg_job_chunks WHERE job_id = ${running}::bigint`).toEqual([{ n: 0 }])
    const after = await t.store.listAudit({ tenant: 'acme', code: 'insufficient_scope', limit: 100 })
    expect(after.length).toBe(audited + table.length)
    // Newest first: the table's rows, in the table's order once reversed.
    const rows = after.slice(0, table.length).reverse()
    expect(rows.map((r) => `${r.method} ${r.path}`)).toEqual(table.map(([, , method, path]) => `${method} /_fencegate/jobs${path}`))
    expect(new Set(rows.map((r) => r.caller))).toEqual(new Set(['host-a']))
    // Control: the same calls with the scope go through (the refusals above were the scope's, not the request's).
    expect((await call(`/${running}/heartbeat`, { sub: 'host-a', scope: 'jobs:work' }, { worker_id: 'host-a', fence: '1' })).status).toBe(200)
    // fencegate:audit is an admin-plane scope only: it reads no job. fencegate:admin holds every scope, but not another worker's lease.
    expect((await call(`/${running}`, { sub: 'auditor', scope: 'fencegate:audit' }, undefined, 'GET')).json.code).toBe('insufficient_scope')
    expect((await call(`/${running}/heartbeat`, { sub: 'ops', scope: 'fencegate:admin' }, { worker_id: 'host-a', fence: '1' })).json.code).toBe('worker_mismatch')
    expect((await call(`/${running}`, { sub: 'ops', scope: 'fencegate:admin' }, undefined, 'GET')).json).toMatchObject({ state: 'running', owner: 'host-a', fence: '1' })
  })

  it('a claim answers the worker_id it recorded: a worker that claimed as its sub heartbeats with it; a batch may name one slot per job', async () => {
    const named = async (key: string) => (await call('', starter, { type: 'named', key })).json.job_id as string
    const first = await named('n1')
    const claimed = await call('/claim', workerA, { types: ['named'] })
    expect(claimed.json).toMatchObject({ job_id: first, worker_id: 'host-a' })
    expect((await call(`/${first}/heartbeat`, workerA, { worker_id: claimed.json.worker_id, fence: claimed.json.fence })).status).toBe(200)
    const [second, third] = [await named('n2'), await named('n3')]
    const batch = await call('/claim', workerA, { types: ['named'], max: 2, worker_ids: ['host-a/slot-1', 'host-a/slot-2'] })
    expect(batch.json.jobs.map((j: { job_id: string; worker_id: string }) => [j.job_id, j.worker_id]).sort())
      .toEqual([[second, 'host-a/slot-1'], [third, 'host-a/slot-2']].sort())
    const owners = await t.db.sql`SELECT id::text, owner FROM fg_jobs WHERE id IN (${second}::bigint, ${third}::bigint) ORDER BY owner`
    expect(owners.map((r) => r.owner)).toEqual(['host-a/slot-1', 'host-a/slot-2'])
    // One id of another worker refuses the whole batch, before anything is claimed.
    await named('n4')
    expect((await call('/claim', workerA, { types: ['named'], max: 2, worker_ids: ['host-a/slot-1', 'host-b/slot-2'] })).json.code).toBe('worker_mismatch')
    expect((await call('/claim', workerA, { types: ['named'], max: 3, worker_ids: ['host-a/slot-1'] })).json.code).toBe('invalid_request')
    expect((await call('/claim', workerA, { types: ['named'], worker_id: 'host-a', worker_ids: ['host-a/slot-1'], max: 1 })).json.code).toBe('invalid_request')
    expect(await t.db.sql`SELECT state FROM fg_jobs WHERE tenant = 'acme' AND key = 'n4'`).toEqual([{ state: 'queued' }])
  })
})
