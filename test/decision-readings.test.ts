import { describe, expect, it } from 'vitest'
import { compileEntityTemplate, compileKeyTemplate } from '../src/config/templates.js'
import { keyHeaderValue, parseIdempotencyKey } from '../src/gateway/idempotency.js'
import { unsafeTarget } from '../src/http/target.js'
import { backends } from './helpers/backends.js'
import { sharedGateway } from './helpers/fresh-gateway.js'
import { post, rawPost, route, testConfig } from './helpers/gateway.js'

/**
 * The review's LOW findings on how a command is read, each replayed: a key two requests
 * shared though they named different operations, a method the upstream took from the body,
 * a path that decoded to a dot segment only on the third decoding, and a key sent in two
 * spellings that the upstream took for two keys.
 */
describe('the LOW findings on reading a command', () => {
  const fx = sharedGateway(backends()[0]!, async ({ upstream }) => ({
    config: testConfig([
      route(upstream.url, { name: 'reports', path: '/reports', entity: undefined, fence: 'off', idempotency: 'required', idempotency_key: 'report:{body.type}:{body.period}' }),
      route(upstream.url, { name: 'pay', path: '/pay/:id', entity: 'pay:{params.id}', fence: 'optional', idempotency: 'optional' }),
      route(upstream.url, { name: 'plain', path: '/plain/:id', entity: undefined, fence: 'off' }),
      route(upstream.url, { name: 'refund', path: '/refund/:id', entity: 'pay:{params.id}', fence: 'optional', idempotency: 'optional', idempotency_payload: 'key' }),
    ]),
  }))

  it('key template parts are separated: type=sales:2026, period=08 replayed type=sales, period=2026:08', async () => {
    const first = await post(`${fx.gw.url}/reports`, undefined, { body: '{"type":"sales:2026","period":"08"}' })
    expect(first.status).toBe(200)
    const other = await post(`${fx.gw.url}/reports`, undefined, { body: '{"type":"sales","period":"2026:08"}' })
    expect(other.status).toBe(200)
    expect(other.headers.get('idempotent-replayed')).toBeNull()
    const again = await post(`${fx.gw.url}/reports`, undefined, { body: '{"type":"sales","period":"2026:08"}' })
    expect(again.headers.get('idempotent-replayed')).toBe('true')
    expect(compileKeyTemplate('report:{body.type}:{body.period}').escape?.source).toBe('[%:]')
    expect(compileEntityTemplate('invoice:{params.id}').escape).toBeUndefined()
    expect(() => compileKeyTemplate('{body.a}{body.b}')).toThrow(/without a literal between them/)
  })

  it('_method in the query or a form body is refused: Rails and Laravel upstreams ran another method', async () => {
    const before = fx.upstream.received.length
    const refusals = [
      await rawPost(`${fx.gw.url}/pay/1?_method=DELETE`, { 'x-execution-fence': '1' }),
      await rawPost(`${fx.gw.url}/pay/1?%5Fmethod=DELETE`, { 'x-execution-fence': '1' }),
      await rawPost(`${fx.gw.url}/pay/1`, { 'x-execution-fence': '1', 'content-type': 'application/x-www-form-urlencoded' }, 'amount=1&_method=DELETE'),
    ]
    for (const res of refusals) expect([res.status, res.body.code]).toEqual([400, 'invalid_request'])
    expect(fx.upstream.received.length).toBe(before)
    expect((await rawPost(`${fx.gw.url}/pay/1?method=x`, { 'x-execution-fence': '1', 'content-type': 'application/x-www-form-urlencoded' }, 'note=_method')).status).toBe(200)
  })

  it.each([
    '/pay/%25%32%65%25%32%65/x', '/pay/%252e%252e', '/pay/%25252e%25252e', '/pay/a%25%32%66b', '/pay/a%25%35%63b', '/pay/a%25%33%62b', '/pay/%25%30%30',
  ])('the raw-target guard decodes until stable: %s is refused', (target) => {
    expect(unsafeTarget(target)?.code).toBe('invalid_request')
  })

  it.each(['/pay/42', '/pay/100%25', '/pay/%25zz', '/pay/%E2%82%AC', '/pay/%2541'])('an ordinary path %s passes the guard', (target) => {
    expect(unsafeTarget(target)).toBeUndefined()
  })

  it('a per-character double-encoded dot segment never reaches the upstream', async () => {
    const res = await rawPost(`${fx.gw.url}/pay/%25%32%65%25%32%65`, { 'x-execution-fence': '1' })
    expect(res.status).toBe(400)
  })

  it('one key on two routes is never a replay of the other route\'s answer: the route is part of every fingerprint', async () => {
    const n = fx.upstream.received.length
    expect((await rawPost(`${fx.gw.url}/pay/9`, { 'x-execution-fence': '1', 'idempotency-key': 'shared-9' })).status).toBe(200)
    // With idempotency_payload: key the fingerprint is (method, route, entity): the entity is the same, the route is not.
    const other = await rawPost(`${fx.gw.url}/refund/9`, { 'x-execution-fence': '1', 'idempotency-key': 'shared-9' })
    expect([other.status, other.body.code]).toEqual([422, 'idempotency_key_reused'])
    expect(fx.upstream.received.length).toBe(n + 1)
  })

  it('the key goes upstream in one form: "pay-77" and pay-77 were one key here and two upstream', async () => {
    const n = fx.upstream.received.length
    expect((await rawPost(`${fx.gw.url}/pay/7`, { 'x-execution-fence': '1', 'idempotency-key': '"pay-77"' })).status).toBe(200)
    expect(fx.upstream.received[n]!.headers['idempotency-key']).toBe('pay-77')
    expect((await rawPost(`${fx.gw.url}/pay/8`, { 'x-execution-fence': '1', 'idempotency-key': '"pay 78"' })).status).toBe(200)
    expect(fx.upstream.received[n + 1]!.headers['idempotency-key']).toBe('"pay 78"')
    for (const key of ['pay-77', 'pay 78', 'a"b', 'a\\b', '"q', 'x,y']) expect(parseIdempotencyKey(keyHeaderValue(key))).toBe(key)
  })
})
