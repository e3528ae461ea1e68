import { describe, expect, it } from 'vitest'
import { backends } from './helpers/backends.js'
import { freshGateway } from './helpers/fresh-gateway.js'
import { post, route, testConfig } from './helpers/gateway.js'

const getJson = async (url: string) => {
  const res = await fetch(url)
  return { status: res.status, json: await res.json() as any }
}

describe.each(backends())('GET /entities/{entity}/history ($name)', (backend) => {
  const fx = freshGateway(backend, ({ upstream }) => ({ config: testConfig([route(upstream.url, { idempotency: 'optional' })]) }))

  it('shows who moved the fence, newest first, with an operator bump in between', async () => {
    await post(`${fx.gw.url}/payments/7/capture`, '1', { headers: { 'x-request-id': 'first' } })
    await post(`${fx.gw.url}/payments/7/capture`, '1')
    await post(`${fx.gw.url}/payments/7/capture`, '2', { headers: { 'x-request-id': 'second' } })
    await fetch(`${fx.gw.adminUrl}/entities/invoice:7/bump`, { method: 'POST', headers: { 'x-request-id': 'incident' }, body: '{"min_fence":"5"}' })
    expect((await post(`${fx.gw.url}/payments/7/capture`, '2')).status).toBe(409)
    const { status, json } = await getJson(`${fx.gw.adminUrl}/entities/invoice:7/history`)
    expect(status).toBe(200)
    expect(json.next_cursor).toBeNull()
    expect(json.items.map((i: any) => [i.old_fence, i.new_fence, i.source, i.route, i.request_id])).toEqual([
      ['2', '5', 'bump', null, 'incident'],
      ['1', '2', 'command', 'capture', 'second'],
      [null, '1', 'command', 'capture', 'first'],
    ])
    expect(Object.keys(json.items[0]).sort()).toEqual(['at', 'caller', 'entity', 'id', 'new_fence', 'old_fence', 'request_id', 'route', 'source', 'tenant'])
    expect(json.items[0]).toMatchObject({ tenant: 'default', entity: 'invoice:7', caller: null })
  })

  it('pages with limit and before, and names the tenant with ?tenant=', async () => {
    for (let f = 1; f <= 5; f++) await post(`${fx.gw.url}/payments/7/capture`, String(f))
    const first = await getJson(`${fx.gw.adminUrl}/entities/invoice:7/history?limit=2`)
    expect(first.json.items.map((i: any) => i.new_fence)).toEqual(['5', '4'])
    expect(first.json.next_cursor).toBe(first.json.items[1].id)
    const second = await getJson(`${fx.gw.adminUrl}/entities/invoice:7/history?limit=3&before=${first.json.next_cursor}`)
    expect(second.json.items.map((i: any) => i.new_fence)).toEqual(['3', '2', '1'])
    expect(second.json.next_cursor).toBeNull()
    expect((await getJson(`${fx.gw.adminUrl}/entities/invoice:7/history?tenant=acme`)).json).toEqual({ items: [], next_cursor: null })
  })

  it('refuses bad paging parameters with invalid_query', async () => {
    for (const q of ['limit=0', 'limit=x', 'before=-1', 'before=1e3', 'nope=1', 'limit=1&limit=2']) {
      const { status, json } = await getJson(`${fx.gw.adminUrl}/entities/invoice:7/history?${q}`)
      expect([q, status, json.code]).toEqual([q, 400, 'invalid_query'])
    }
  })

  it('lists the entity\'s live idempotency records without bodies', async () => {
    await post(`${fx.gw.url}/payments/7/capture`, '1', { headers: { 'idempotency-key': 'k-1' } })
    const { json } = await getJson(`${fx.gw.adminUrl}/entities/invoice:7/keys`)
    expect(json.items).toEqual([expect.objectContaining({ key: 'k-1', state: 'completed', status: 200, fence: '1', route: 'capture' })])
    expect(json.items[0]).not.toHaveProperty('body')
    expect(json.items[0]).not.toHaveProperty('headers')
  })
})
