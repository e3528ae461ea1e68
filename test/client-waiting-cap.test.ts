/**
 * The worker SDK against a gateway that holds as many waiting claims of the tenant as it
 * allows (`job_waiting_claims`, here 1): its `429 too_many_waiting_claims` is no error to the
 * worker, but a wait: the claim is sent again after `Retry-After` while its own wait lasts.
 */
import { afterEach, describe, expect, it } from 'vitest'
import { FencegateClient, type FetchLike } from '../src/client/index.js'
import { createJobStore } from '../src/leases/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { call, until, waitJobTypes } from './helpers/claim-gateway.js'
import { counting } from './helpers/counting.js'
import { route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'

describe.each(backends())('the SDK and the waiting-claim cap on $name', (backend) => {
  let t: TestDb
  let gw: TestGateway | undefined
  const leaving = new Set<AbortController>()
  afterEach(async () => {
    for (const c of leaving) c.abort()
    leaving.clear()
    await gw?.close()
    gw = undefined
    await t.close()
  })

  /** A gateway whose only waiting place for the tenant is taken by another worker's claim. */
  async function full() {
    t = await backend.open()
    const db = counting(t.db)
    gw = await startTestGateway({ config: testConfig([route('http://127.0.0.1:9')], { job_types: waitJobTypes, job_waiting_claims: 1 }), store: t.store, jobs: createJobStore(db) })
    const jobs = `${gw.url}/_fencegate/jobs`
    const controller = new AbortController()
    leaving.add(controller)
    const holder = call(`${jobs}/claim`, { worker_id: 'holder', wait: 25 }, { signal: controller.signal })
    // Left waiting, it is aborted after the test.
    holder.catch(() => {})
    // Its first attempt is the store's first statement, made once it holds the place.
    await until('the holder waits', () => db.count === 1)
    return { jobs, holder }
  }

  /** The real fetch, noting each claim's status, and running `onRefused` before the SDK sees a 429. */
  function noting(onRefused: () => Promise<void> = async () => {}) {
    const statuses: number[] = []
    const fetchImpl: FetchLike = async (input, init) => {
      const res = await fetch(input, init)
      if (!String(input).endsWith('/claim')) return res
      statuses.push(res.status)
      if (res.status === 429) await onRefused()
      return res
    }
    return { statuses, fetch: fetchImpl }
  }

  it('a claim refused for the cap is sent again after Retry-After within its wait, and gets a job (it threw ProblemError 429)', async () => {
    const { jobs, holder } = await full()
    let second = ''
    const sdk = noting(async () => {
      // The holder is served, which frees its place, and one more job is there for the SDK's next try.
      await call(jobs, { type: 'report', key: 'for-holder' })
      expect((await holder).status).toBe(200)
      second = (await call(jobs, { type: 'report', key: 'for-sdk' })).json.job_id
    })
    const client = new FencegateClient({ baseUrl: gw!.url, fetch: sdk.fetch })
    const claimed = await client.claim({ types: ['report'], wait: 5, workerId: 'w1' })
    expect(claimed?.job.id).toBe(second)
    expect(sdk.statuses).toEqual([429, 200])
    await claimed!.lease.complete('done')
  })

  it('a claim refused for the cap until its wait runs out returns nothing, not an error', async () => {
    await full()
    const sdk = noting()
    const client = new FencegateClient({ baseUrl: gw!.url, fetch: sdk.fetch })
    expect(await client.claim({ types: ['report'], wait: 1, workerId: 'w1' })).toBeUndefined()
    expect(sdk.statuses.length).toBeGreaterThanOrEqual(1)
    expect(new Set(sdk.statuses)).toEqual(new Set([429]))
  })
})
