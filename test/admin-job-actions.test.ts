import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createJobStore } from '../src/leases/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { hmacAuthenticator, jwtAuth, token } from './helpers/tokens.js'

/**
 * An operator's actions on jobs (admin plane, fencegate:admin): cancel, release (end the
 * lease now) and retry. Before, the admin plane could only read jobs: a stuck holder kept
 * its job until its lease ran out, and a failed job could only be restarted by whoever
 * knew its natural key.
 */
describe.each(backends())('operator actions on jobs ($name)', (backend) => {
  let t: TestDb
  let gw: TestGateway

  beforeAll(async () => {
    t = await backend.open()
    gw = await startTestGateway({
      config: testConfig([route('http://127.0.0.1:9')], { auth: jwtAuth, job_types: [{ name: 'report', lease: '45s', max_attempts: 1 }] }),
      store: t.store, jobs: createJobStore(t.db), db: t.db, authenticate: await hmacAuthenticator(),
    })
  })
  afterAll(async () => {
    await gw.close()
    await t.close()
  })

  const send = async (url: string, claims: Record<string, unknown>, body?: unknown) => {
    const res = await fetch(url, {
      method: 'POST', headers: { authorization: `Bearer ${await token(claims)}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    })
    return { status: res.status, json: await res.json() as any }
  }
  const worker = (sub: string) => ({ sub, scope: 'jobs:work jobs:start jobs:read' })
  // An operator of another tenant, as issue 30 found them: the token's tenant is `ops`.
  const operator = { sub: 'oncall@example', tenant_id: 'ops', scope: 'fencegate:admin' }
  const jobs = (path: string, who: Record<string, unknown>, body?: unknown) => send(`${gw.url}/_fencegate/jobs${path}`, who, body)
  const act = (id: string, action: string, who: Record<string, unknown> = operator) => send(`${gw.adminUrl}/jobs/${id}/${action}?tenant=acme`, who)
  const claimed = async (key: string, sub: string) => {
    await jobs('', worker(sub), { type: 'report', key })
    return (await jobs('/claim', worker(sub), { types: ['report'] })).json as { job_id: string; fence: string }
  }
  const auditOf = async (id: string) => (await t.store.listAudit({ limit: 100, tenant: 'acme', entity: `job:${id}` }))
    .map((a) => [a.code, a.caller, a.highest_fence, a.path])

  it('release ends the lease now: the holder is refused, the next claim gets the job with a higher fence, and it is audited', async () => {
    const held = await claimed('release-me', 'host-a')
    const r = await act(held.job_id, 'release')
    expect(r).toMatchObject({ status: 200, json: { tenant: 'acme', job_id: held.job_id, state: 'queued', fence: held.fence } })
    const beat = await jobs(`/${held.job_id}/heartbeat`, worker('host-a'), { worker_id: 'host-a', fence: held.fence })
    expect([beat.status, beat.json.code]).toEqual([409, 'lease_lost'])
    const next = (await jobs('/claim', worker('host-b'), { types: ['report'] })).json
    expect(next.job_id).toBe(held.job_id)
    expect(BigInt(next.fence)).toBeGreaterThan(BigInt(held.fence))
    // max_attempts 1: the released attempt was not counted, or this claim would have found none left.
    expect(next.attempt).toBe(1)
    const done = await jobs(`/${held.job_id}/complete`, worker('host-a'), { worker_id: 'host-a', fence: held.fence, result: 'late' })
    expect(done.status).toBe(409)
    // Newest first: the old holder's late completion is audited too.
    expect(await auditOf(held.job_id)).toEqual([
      ['result_rejected', 'host-a', next.fence, `/_fencegate/jobs/${held.job_id}/complete`],
      ['job_released', 'oncall@example', held.fence, `/jobs/${held.job_id}/release`],
    ])
    expect((await act(held.job_id, 'release', worker('host-a'))).json.code).toBe('insufficient_scope')
  })

  it('cancel stops a queued job at once and a running one at its next heartbeat; a finished job is refused', async () => {
    const { json: queued } = await jobs('', worker('host-a'), { type: 'report', key: 'cancel-queued' })
    expect((await act(queued.job_id, 'cancel')).json).toMatchObject({ state: 'cancelled' })
    const held = await claimed('cancel-running', 'host-a')
    expect((await act(held.job_id, 'cancel')).json).toMatchObject({ state: 'running' })
    const beat = await jobs(`/${held.job_id}/heartbeat`, worker('host-a'), { worker_id: 'host-a', fence: held.fence })
    expect([beat.status, beat.json.cancel_requested]).toEqual([200, true])
    const released = await jobs(`/${held.job_id}/release`, worker('host-a'), { worker_id: 'host-a', fence: held.fence })
    expect(released.json.state).toBe('cancelled')
    const again = await act(queued.job_id, 'cancel')
    expect([again.status, again.json.code]).toEqual([409, 'job_finished'])
    expect((await auditOf(queued.job_id)).map((a) => a[0])).toEqual(['job_cancelled'])
  })

  it('retry runs a failed job again under a higher fence, and refuses one that has not finished', async () => {
    const held = await claimed('retry-me', 'host-a')
    await jobs(`/${held.job_id}/fail`, worker('host-a'), { worker_id: 'host-a', fence: held.fence, error: { message: 'boom' }, retryable: false })
    const r = await act(held.job_id, 'retry')
    expect(r).toMatchObject({ status: 200, json: { state: 'queued' } })
    const next = (await jobs('/claim', worker('host-b'), { types: ['report'] })).json
    expect([next.job_id, next.attempt]).toEqual([held.job_id, 1])
    expect(BigInt(next.fence)).toBeGreaterThan(BigInt(held.fence))
    const refused = await act(held.job_id, 'retry')
    expect([refused.status, refused.json.code]).toEqual([409, 'job_not_retryable'])
    expect((await act('999999', 'retry')).json.code).toBe('job_not_found')
    expect(await auditOf(held.job_id)).toEqual([['job_retried', 'oncall@example', held.fence, `/jobs/${held.job_id}/retry`]])
  })

  it('of 20 concurrent releases of one lease exactly one ends it, and one audit row says so', async () => {
    const held = await claimed('release-race', 'host-a')
    const results = await Promise.all(Array.from({ length: 20 }, () => act(held.job_id, 'release')))
    expect(results.filter((r) => r.status === 200)).toHaveLength(1)
    expect(results.filter((r) => r.status === 409).map((r) => r.json.code)).toEqual(Array(19).fill('job_not_running'))
    expect((await auditOf(held.job_id)).map((a) => a[0])).toEqual(['job_released'])
  })

  it('acts only in the tenant asked for: a job of another tenant is not found', async () => {
    const held = await claimed('tenant-bound', 'host-a')
    const elsewhere = await send(`${gw.adminUrl}/jobs/${held.job_id}/release?tenant=other`, operator)
    expect([elsewhere.status, elsewhere.json.code]).toEqual([404, 'job_not_found'])
    expect((await t.store.listAudit({ limit: 10, tenant: 'other' })).map((a) => a.code)).toEqual([])
  })
})
