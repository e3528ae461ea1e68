import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { installFenceLog } from './helpers/fence-log.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

const bump = (gw: TestGateway, entity: string, body: unknown, requestId: string = crypto.randomUUID()) =>
  fetch(`${gw.adminUrl}/entities/${encodeURIComponent(entity)}/bump`, {
    method: 'POST', headers: { 'content-type': 'application/json', 'x-request-id': requestId }, body: typeof body === 'string' ? body : JSON.stringify(body),
  }).then(async (res) => ({ status: res.status, json: await res.json() as any }))

describe.each(backends())('fence bump ($name)', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway

  beforeEach(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    gw = await startTestGateway({ config: testConfig([route(upstream.url)]), store: t.store })
  })
  afterEach(async () => {
    await gw.close()
    await upstream.close()
    await t.close()
  })

  it('cuts off every holder of a lower token at once, and audits who did it', async () => {
    expect((await post(`${gw.url}/payments/42/capture`, '42')).status).toBe(200)
    const res = await bump(gw, 'invoice:42', { min_fence: '43' }, 'incident-7')
    expect(res.status).toBe(200)
    expect(res.json).toEqual({ tenant: 'default', entity: 'invoice:42', previous_fence: '42', highest_fence: '43', raised: true })
    const stale = await post(`${gw.url}/payments/42/capture`, '42')
    expect(stale.status).toBe(409)
    expect(stale.json).toMatchObject({ code: 'stale_fence', highest_fence: '43' })
    expect((await post(`${gw.url}/payments/42/capture`, '43')).status).toBe(200)
    expect(upstream.received).toHaveLength(2)
    const audit = await (await fetch(`${gw.adminUrl}/audit?code=fence_bumped`)).json() as any
    expect(audit.items).toEqual([expect.objectContaining({ entity: 'invoice:42', presented_fence: '43', highest_fence: '42', request_id: 'incident-7' })])
  })

  it('never lowers a fence: a bump below the highest changes nothing but is still audited', async () => {
    await post(`${gw.url}/payments/42/capture`, '50')
    const res = await bump(gw, 'invoice:42', { min_fence: 43 })
    expect(res.json).toMatchObject({ previous_fence: '50', highest_fence: '50', raised: false })
    expect((await post(`${gw.url}/payments/42/capture`, '50')).status).toBe(200)
    const audit = await (await fetch(`${gw.adminUrl}/audit?code=fence_bumped`)).json() as any
    expect(audit.items).toHaveLength(1)
  })

  it('sets a floor for an entity that has never seen a fence', async () => {
    const res = await bump(gw, 'invoice:9', { min_fence: '5' })
    expect(res.json).toMatchObject({ previous_fence: null, highest_fence: '5', raised: true })
    expect((await post(`${gw.url}/payments/9/capture`, '4')).status).toBe(409)
  })

  it('bumps the entity of the tenant named by ?tenant=, and only that one', async () => {
    const res = await fetch(`${gw.adminUrl}/entities/invoice:5/bump?tenant=acme`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"min_fence": "9"}' })
    expect(await res.json()).toMatchObject({ tenant: 'acme', entity: 'invoice:5', highest_fence: '9' })
    expect(await (await fetch(`${gw.adminUrl}/entities/invoice:5?tenant=acme`)).json()).toMatchObject({ highest_fence: '9' })
    expect((await fetch(`${gw.adminUrl}/entities/invoice:5`)).status).toBe(404)
    expect((await post(`${gw.url}/payments/5/capture`, '1')).status).toBe(200)
  })

  it.each([
    ['not JSON', '{'],
    ['no min_fence', {}],
    ['a negative fence', { min_fence: '-1' }],
    ['a fence beyond 2^63-1', { min_fence: '9223372036854775808' }],
    ['an unsafe number', { min_fence: 2 ** 60 }],
    ['an extra field', { min_fence: '1', entity: 'x' }],
  ])('refuses a body with %s (400 invalid_request), changing nothing', async (_what, body) => {
    const res = await bump(gw, 'invoice:1', body)
    expect(res.status).toBe(400)
    expect(res.json.code).toBe('invalid_request')
    expect((await fetch(`${gw.adminUrl}/entities/invoice:1`)).status).toBe(404)
  })

  it('is atomic with concurrent commands: no fence below the floor is accepted after the bump commits', async () => {
    await installFenceLog(t.db)
    const send = (fence: number) => post(`${gw.url}/payments/1/capture`, String(fence), { headers: { 'x-request-id': `r${fence}` } })
    const first = Array.from({ length: 100 }, (_, i) => send(i + 1))
    await upstream.arrived(10)
    const [bumped, ...rest] = await Promise.all([bump(gw, 'invoice:1', { min_fence: '10000' }, 'the-bump'), ...Array.from({ length: 100 }, (_, i) => send(101 + i)), ...first])
    expect(bumped!.json.raised).toBe(true)
    const log = await t.db.sql<{ seq: string; request_id: string }>`SELECT seq::text, request_id FROM test_fence_log ORDER BY seq`
    const bumpSeq = Number(log.find((l) => l.request_id === 'the-bump')!.seq)
    const acceptedAt = new Map<string, number>()
    for (const l of log) if (!acceptedAt.has(l.request_id)) acceptedAt.set(l.request_id, Number(l.seq))
    for (const [i, res] of rest.entries()) {
      const fence = i < 100 ? 101 + i : i - 99
      if (res.status === 200) expect(acceptedAt.get(`r${fence}`)! < bumpSeq, `r${fence} accepted after the bump`).toBe(true)
      else expect(res.json.code).toBe('stale_fence')
    }
    expect((await post(`${gw.url}/payments/1/capture`, '9999')).status).toBe(409)
  })
})
