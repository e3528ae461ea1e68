import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

describe.each(backends())('a replay on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway

  beforeEach(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    gw = await startTestGateway({
      config: testConfig([
        route(upstream.url, { idempotency: 'required' }),
        route(upstream.url, { name: 'unfenced', path: '/refunds/:id', fence: 'off', entity: undefined, idempotency: 'required' }),
      ]),
      store: t.store,
    })
  })
  afterEach(async () => {
    await gw.close()
    await upstream.close()
    await t.close()
  })

  /** The row versions (xmin) of the entity's fence and of the key's record: a write changes them. */
  async function versions(entity: string | null, key: string) {
    const [fence] = entity === null ? [] : await t.db.sql<{ xmin: string }>`SELECT xmin::text FROM fg_fences WHERE tenant = 'default' AND entity = ${entity}`
    const [record] = await t.db.sql<{ xmin: string }>`SELECT xmin::text FROM fg_idempotency WHERE tenant = 'default' AND key = ${key}`
    return { fence: fence?.xmin, record: record?.xmin }
  }
  const send = (path: string, fence: string | undefined, key: string, requestId: string) =>
    post(`${gw.url}${path}`, fence, { headers: { 'idempotency-key': key, 'x-request-id': requestId } })

  it("at the entity's highest fence writes neither the fence row nor the key's record", async () => {
    expect((await send('/payments/42/capture', '5', 'k', 'original')).status).toBe(200)
    const before = await versions('invoice:42', 'k')
    expect(before.fence).toBeDefined()
    const replay = await send('/payments/42/capture', '5', 'k', 'duplicate')
    expect([replay.status, replay.headers.get('idempotent-replayed'), replay.headers.get('x-request-id')]).toEqual([200, 'true', 'duplicate'])
    expect(await versions('invoice:42', 'k')).toEqual(before)
    expect(await t.store.getEntity('default', 'invoice:42')).toMatchObject({ highest_fence: '5', request_id: 'original' })
    expect(upstream.received).toHaveLength(1)
  })

  it('with a higher fence still raises the fence and names the replaying request', async () => {
    await send('/payments/42/capture', '5', 'k', 'original')
    const replay = await send('/payments/42/capture', '6', 'k', 'new-owner')
    expect([replay.status, replay.headers.get('idempotent-replayed')]).toEqual([200, 'true'])
    expect(await t.store.getEntity('default', 'invoice:42')).toMatchObject({ highest_fence: '6', request_id: 'new-owner' })
    const stale = await send('/payments/42/capture', '5', 'k', 'old-owner')
    expect([stale.status, stale.json.code, stale.json.highest_fence]).toEqual([409, 'stale_fence', '6'])
    expect(upstream.received).toHaveLength(1)
  })

  it('with a fence above an entity other requests have since raised is refused as stale, fence first', async () => {
    await send('/payments/42/capture', '5', 'k', 'original')
    await post(`${gw.url}/payments/42/capture`, '7', { headers: { 'idempotency-key': 'other' } })
    const stale = await send('/payments/42/capture', '5', 'k', 'late')
    expect([stale.status, stale.json.code, stale.json.highest_fence]).toEqual([409, 'stale_fence', '7'])
  })

  it('without a fence writes nothing either', async () => {
    expect((await send('/refunds/9', undefined, 'r', 'original')).status).toBe(200)
    const before = await versions(null, 'r')
    const replay = await send('/refunds/9', undefined, 'r', 'duplicate')
    expect([replay.status, replay.headers.get('idempotent-replayed')]).toEqual([200, 'true'])
    expect(await versions(null, 'r')).toEqual(before)
  })

  it('is not made from an expired record, nor with another payload', async () => {
    await send('/payments/42/capture', '5', 'k', 'original')
    const reused = await post(`${gw.url}/payments/42/capture`, '5', { headers: { 'idempotency-key': 'k' }, body: '{"other":1}' })
    expect([reused.status, reused.json.code]).toEqual([422, 'idempotency_key_reused'])
    await t.db.sql`UPDATE fg_idempotency SET expires_at = now() - interval '1 second' WHERE key = 'k'`
    const again = await send('/payments/42/capture', '5', 'k', 'after-expiry')
    expect([again.status, again.headers.get('idempotent-replayed')]).toEqual([200, null])
    expect(upstream.received).toHaveLength(2)
  })
})
