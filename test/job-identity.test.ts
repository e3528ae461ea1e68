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
      config: testConfig([route('http://127.0.0.1:9')], { auth: jwtAuth, job_types: [{ name: 'report', lease: '45s' }] }),
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
})
