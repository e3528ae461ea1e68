import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createJobStore } from '../src/leases/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { hmacAuthenticator, jwtAuth, token } from './helpers/tokens.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * A lease is held by the subject whose token claimed it (fg_jobs.owner_sub, migrations/0019),
 * compared exactly. Before: a `fence: lease` route accepted the live fence from any token of the
 * tenant (fences are small sequential numbers: a token with no scopes guessed one on its third
 * try and was forwarded during another worker's lease); and a token whose `sub` is `svc` could
 * name the worker `svc/payments` (its "slot") and complete the job that `svc/payments` held.
 */
describe.each(backends())('who holds a lease, under auth, on $name', (backend) => {
  let t: TestDb
  let gw: TestGateway
  let upstream: TestUpstream

  beforeAll(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    gw = await startTestGateway({
      config: testConfig([route(upstream.url, { name: 'render', path: '/reports/:id', fence: 'lease', entity: 'job:{header.X-Job-Id}' })],
        { auth: jwtAuth, job_types: [{ name: 'report', lease: '45s' }] }),
      store: t.store, jobs: createJobStore(t.db), authenticate: await hmacAuthenticator(),
    })
  })
  afterAll(async () => {
    await gw.close()
    await upstream.close()
    await t.close()
  })

  const call = async (path: string, claims: Record<string, unknown>, body: unknown) => {
    const res = await fetch(`${gw.url}/_fencegate/jobs${path}`, {
      method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${await token(claims)}` }, body: JSON.stringify(body),
    })
    return { status: res.status, json: await res.json() as Record<string, any> }
  }
  const step = async (claims: Record<string, unknown>, jobId: string, fence: string) =>
    post(`${gw.url}/reports/1`, fence, { headers: { 'x-job-id': jobId, authorization: `Bearer ${await token(claims)}` } })
  const starter = { sub: 'scheduler', scope: 'jobs:start' }
  const startAndClaim = async (key: string, holder: Record<string, unknown>, workerId?: string) => {
    const { json: job } = await call('', starter, { type: 'report', key })
    const { json: claimed } = await call('/claim', holder, workerId === undefined ? {} : { worker_id: workerId })
    expect(claimed.job_id).toBe(job.job_id)
    return claimed as { job_id: string; fence: string; worker_id: string }
  }

  it('another token of the tenant presenting the live fence on a fence: lease route is refused, audited, and nothing is forwarded; the holder is', async () => {
    const holder = { sub: 'host-a', scope: 'jobs:work' }
    const lease = await startAndClaim('guessed', holder)
    const sent = upstream.received.length
    // The replay of the finding: a token with no scopes walks the small fences, the live one among them.
    for (const fence of ['1', '2', '3', lease.fence]) {
      const res = await step({ sub: 'guesser' }, lease.job_id, fence)
      expect([res.status, res.json.code], fence).toEqual([409, 'lease_expired'])
    }
    // Neither another worker of the tenant, nor a token without a sub, nor one whose sub merely starts with the holder's.
    for (const other of [{ sub: 'host-b', scope: 'jobs:work' }, { sub: undefined }, { sub: 'host-a/slot-1' }]) {
      expect((await step(other, lease.job_id, lease.fence)).json.code).toBe('lease_expired')
    }
    expect(upstream.received.length).toBe(sent)
    const audited = await t.store.listAudit({ tenant: 'acme', code: 'lease_expired', limit: 20 })
    expect(audited.filter((r) => r.caller === 'guesser')).toHaveLength(4)
    // The holder's own token is forwarded, with the same fence, and whatever slot it runs in.
    expect((await step(holder, lease.job_id, lease.fence)).status).toBe(200)
    expect(upstream.received.at(-1)!.headers['x-execution-fence']).toBe(lease.fence)
    // And the lease is untouched by the refusals: the holder completes it.
    expect((await call(`/${lease.job_id}/complete`, holder, { worker_id: 'host-a', fence: lease.fence, result: 1 })).status).toBe(200)
  })

  it('a token whose sub is a prefix (svc) cannot heartbeat, append, complete, fail or release svc/payments\' job, nor step on its lease', async () => {
    const payments = { sub: 'svc/payments', scope: 'jobs:work jobs:read' }
    const svc = { sub: 'svc', scope: 'jobs:work jobs:read' }
    const lease = await startAndClaim('payments', payments)
    expect(lease.worker_id).toBe('svc/payments')
    const held = { worker_id: 'svc/payments', fence: lease.fence }
    for (const [verb, body] of [['heartbeat', held], ['append', { ...held, seq: 0, chunk: 'x' }], ['complete', { ...held, result: 'forged' }], ['fail', { ...held, retryable: false }], ['release', held]] as const) {
      const res = await call(`/${lease.job_id}/${verb}`, svc, body)
      expect([res.status, res.json.code], verb).toEqual([403, 'worker_mismatch'])
    }
    expect((await step(svc, lease.job_id, lease.fence)).json.code).toBe('lease_expired')
    const job = await fetch(`${gw.url}/_fencegate/jobs/${lease.job_id}`, { headers: { authorization: `Bearer ${await token(payments)}` } }).then((r) => r.json()) as Record<string, unknown>
    expect(job).toMatchObject({ state: 'running', owner: 'svc/payments', fence: lease.fence, cursor_length: 0 })
    expect((await t.store.listAudit({ tenant: 'acme', code: 'worker_mismatch', limit: 20 })).filter((r) => r.caller === 'svc')).toHaveLength(5)
    // The holder itself, and a slot of it, act as before.
    expect((await call(`/${lease.job_id}/heartbeat`, payments, held)).status).toBe(200)
    expect((await call(`/${lease.job_id}/complete`, payments, { ...held, result: 'real' })).status).toBe(200)
  })

  it('a lease svc claims under the name svc/payments is svc\'s: the token whose sub is svc/payments cannot act on it', async () => {
    const lease = await startAndClaim('named', { sub: 'svc', scope: 'jobs:work' }, 'svc/payments')
    const res = await call(`/${lease.job_id}/heartbeat`, { sub: 'svc/payments', scope: 'jobs:work' }, { worker_id: 'svc/payments', fence: lease.fence })
    expect([res.status, res.json.code]).toEqual([403, 'worker_mismatch'])
    expect((await call(`/${lease.job_id}/heartbeat`, { sub: 'svc', scope: 'jobs:work' }, { worker_id: 'svc/payments', fence: lease.fence })).status).toBe(200)
  })
})
