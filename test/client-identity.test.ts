import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { FencegateClient, FencegateClientError, type FetchLike, type WorkEvent } from '../src/client/index.js'
import { subjectOf } from '../src/client/identity.js'
import { createJobStore } from '../src/leases/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { hmacAuthenticator, jwtAuth, token } from './helpers/tokens.js'

/**
 * The worker SDK names itself as the gateway will see it: under `auth.mode: jwt` the worker is
 * the token's `sub`, and each slot of `work()` is `sub/slot-<n>`. Before, the SDK sent a random
 * `worker-<uuid>` (refused as 403 worker_mismatch under auth) shared by every slot.
 */

/** Polls until `check` holds: on the gateway's or the database's state, never on elapsed time. */
async function until(check: () => boolean | Promise<boolean>): Promise<void> {
  while (!(await check())) await new Promise((r) => setTimeout(r, 20))
}

/** The real fetch, noting each claim's body and each heartbeat's status by job. */
function recordingFetch() {
  const claims: Record<string, unknown>[] = []
  const heartbeats = new Map<string, number[]>()
  const fetchImpl: FetchLike = async (input, init) => {
    const path = new URL(String(input)).pathname
    if (path.endsWith('/claim')) claims.push(JSON.parse(String(init!.body)) as Record<string, unknown>)
    const answer = await fetch(input, init)
    const beat = /\/jobs\/(\d+)\/heartbeat$/.exec(path)
    if (beat) heartbeats.set(beat[1]!, [...(heartbeats.get(beat[1]!) ?? []), answer.status])
    return answer
  }
  return { claims, heartbeats, fetch: fetchImpl }
}

describe('the SDK reads its worker id from its token', () => {
  it('takes the sub of a JWT without verifying it, and nothing from a token that is not one', async () => {
    expect(subjectOf(await token({ sub: 'host-ü/1' }))).toBe('host-ü/1')
    expect(subjectOf(undefined)).toBeUndefined()
    expect(subjectOf('opaque-token')).toBeUndefined()
    expect(subjectOf('a.!!!.c')).toBeUndefined()
    expect(subjectOf(await token({ sub: 42 }))).toBeUndefined()
  })

  it('is the sub, or a workerId under it; a workerId the gateway would refuse throws at construction and at the call, sending nothing', async () => {
    const baseUrl = 'http://127.0.0.1:9'
    const tok = await token({ sub: 'host-a' })
    expect(new FencegateClient({ baseUrl, token: tok }).workerId).toBe('host-a')
    expect(new FencegateClient({ baseUrl, token: tok, workerId: 'host-a/blue' }).workerId).toBe('host-a/blue')
    expect(new FencegateClient({ baseUrl }).workerId).toMatch(/^worker-[0-9a-f-]{36}$/)
    expect(new FencegateClient({ baseUrl, token: 'opaque', workerId: 'anything' }).workerId).toBe('anything')
    expect(() => new FencegateClient({ baseUrl, token: tok, workerId: 'host-ab' })).toThrow(expect.objectContaining({ code: 'worker_mismatch' }))
    let sent = 0
    const client = new FencegateClient({ baseUrl, token: tok, fetch: async () => { sent++; return new Response(null, { status: 204 }) } })
    await expect(client.claim({ workerId: 'host-b' })).rejects.toBeInstanceOf(FencegateClientError)
    await expect(client.work({ workerId: 'host-b', signal: new AbortController().signal }, () => undefined)).rejects.toMatchObject({ code: 'worker_mismatch' })
    expect(sent).toBe(0)
  })

  it('regression: a sub too long for its slot suffix failed every claim; work() now refuses it before sending', async () => {
    let sent = 0
    const fetchImpl: FetchLike = async () => { sent++; return new Response(null, { status: 204 }) }
    const client = new FencegateClient({ baseUrl: 'http://127.0.0.1:9', token: await token({ sub: 'h'.repeat(250) }), fetch: fetchImpl })
    await expect(client.work({ concurrency: 2, signal: new AbortController().signal }, () => undefined)).rejects.toMatchObject({ code: 'invalid_option' })
    expect(sent).toBe(0)
  })
})

describe.each(backends())('work() under auth.mode jwt on $name', (backend) => {
  let t: TestDb
  let gw: TestGateway

  beforeAll(async () => {
    t = await backend.open()
    gw = await startTestGateway({
      // A 1 s lease: heartbeats every third of it, so each job is renewed while the test waits on both slots.
      config: testConfig([route('http://127.0.0.1:9')], { auth: jwtAuth, job_types: [{ name: 'slotted', lease: '1s' }] }),
      store: t.store, jobs: createJobStore(t.db), authenticate: await hmacAuthenticator(),
    })
  })
  afterAll(async () => {
    await gw.close()
    await t.close()
  })

  it('with concurrency 2 and a token, each slot claims as sub/slot-n, renews and completes its own job', async () => {
    const starter = new FencegateClient({ baseUrl: gw.url, token: await token({ sub: 'scheduler', scope: 'jobs:start' }) })
    const ids = [(await starter.start({ type: 'slotted', key: 'a' })).job_id, (await starter.start({ type: 'slotted', key: 'b' })).job_id]
    const rec = recordingFetch()
    const client = new FencegateClient({ baseUrl: gw.url, token: await token({ sub: 'host-a', scope: 'jobs:work' }), fetch: rec.fetch })
    const events: WorkEvent[] = []
    const stop = new AbortController()
    const running = new Map<string, string>()
    let finish!: () => void
    const gate = new Promise<void>((r) => (finish = r))
    const working = client.work({ types: ['slotted'], concurrency: 2, signal: stop.signal, claimWait: 1, onEvent: (e) => events.push(e) }, async (job, lease) => {
      running.set(job.id, lease.workerId)
      await gate
      return { by: lease.workerId }
    })
    const renewed = (id: string) => (rec.heartbeats.get(id) ?? []).includes(200)
    // Both jobs held at once, each renewed under its own slot's id at least once.
    await until(() => running.size === 2 && ids.every(renewed))
    const owners = await t.db.sql<{ id: string; owner: string }>`SELECT id::text, owner FROM fg_jobs WHERE id IN (${ids[0]}::bigint, ${ids[1]}::bigint) ORDER BY owner`
    expect(owners.map((r) => r.owner)).toEqual(['host-a/slot-1', 'host-a/slot-2'])
    expect(Object.fromEntries(owners.map((r) => [r.id, r.owner]))).toEqual(Object.fromEntries(running))
    expect(rec.claims[0]).toMatchObject({ worker_ids: ['host-a/slot-1', 'host-a/slot-2'], max: 2 })
    finish()
    await until(async () => (await t.db.sql`SELECT 1 FROM fg_jobs WHERE type = 'slotted' AND state = 'succeeded'`).length === 2)
    stop.abort()
    await working
    const done = await t.db.sql<{ id: string; result: unknown }>`SELECT id::text, result FROM fg_jobs WHERE type = 'slotted' ORDER BY id`
    expect(done.map((r) => r.result)).toEqual(ids.map((id) => ({ by: running.get(id) })))
    expect([...rec.heartbeats.values()].flat().every((s) => s === 200)).toBe(true)
    expect(events.filter((e) => e.type === 'error' || e.type === 'lost')).toEqual([])
  })

  it('with concurrency 1 the one slot is the sub itself', async () => {
    const starter = new FencegateClient({ baseUrl: gw.url, token: await token({ sub: 'scheduler', scope: 'jobs:start' }) })
    const { job_id } = await starter.start({ type: 'slotted', key: 'single' })
    const client = new FencegateClient({ baseUrl: gw.url, token: await token({ sub: 'host-s', scope: 'jobs:work' }) })
    const stop = new AbortController()
    let owner: string | undefined
    await client.work({ types: ['slotted'], signal: stop.signal, claimWait: 1, onEvent: (e) => e.type === 'completed' && stop.abort() }, async (_job, lease) => {
      owner = lease.workerId
      return { ok: true }
    })
    expect(owner).toBe('host-s')
    const [row] = await t.db.sql<{ owner: string; state: string }>`SELECT owner, state FROM fg_jobs WHERE id = ${job_id}::bigint`
    expect(row).toEqual({ owner: 'host-s', state: 'succeeded' })
  })
})
