import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { checkFenceOrder, installFenceLog, type Outcome } from './helpers/fence-log.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

describe.each(backends())('concurrent fences on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway

  beforeEach(async () => {
    t = await backend.open()
    await installFenceLog(t.db)
    upstream = await startUpstream()
    gw = await startTestGateway({ config: testConfig([route(upstream.url)]), store: t.store })
  })
  afterEach(async () => {
    await gw.close()
    await upstream.close()
    await t.close()
  })

  it('200 parallel requests with random fences on one entity keep one fence order', async () => {
    // Fences drawn from a small range so equal fences and near-ties are frequent.
    const fences = Array.from({ length: 200 }, (_, i) => 1 + ((i * 7919 + 13) % 97))
    const outcomes: Outcome[] = await Promise.all(fences.map(async (fence, i) => {
      const requestId = `c-${i}`
      const res = await post(`${gw.url}/payments/42/capture`, String(fence), { headers: { 'x-request-id': requestId } })
      return { requestId, fence, status: res.status, body: res.json }
    }))
    const forwarded = upstream.received.map((r) => Number(r.headers['x-execution-fence']))
    const entity = await t.store.getEntity('default', 'invoice:42')
    await checkFenceOrder(t.db, outcomes, forwarded, entity!.highest_fence)
    const audited = await t.store.listAudit({ limit: 1000, code: 'stale_fence' })
    expect(audited.map((a) => a.request_id).sort()).toEqual(outcomes.filter((o) => o.status === 409).map((o) => o.requestId).sort())
  })
})
