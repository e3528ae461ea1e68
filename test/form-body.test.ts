import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { isFormBody, parseFormBody } from '../src/http/form-body.js'
import { compileEntityTemplate, resolveEntity } from '../src/gateway/route.js'
import { entitySources } from '../src/gateway/command.js'
import { FencegateError } from '../src/http/problems.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

const form = 'application/x-www-form-urlencoded'
const bytes = (text: string) => new TextEncoder().encode(text)
/** Resolves a template against a request with the given body and Content-Type, as the pipeline does. */
function resolve(template: string, body: string, contentType = form): string {
  const request = new Request('http://gw/x', { method: 'POST', headers: { 'content-type': contentType } })
  return resolveEntity(compileEntityTemplate(template), entitySources(request, new URL(request.url), {}, bytes(body)))
}
function refusal(template: string, body: string, contentType = form): FencegateError {
  try {
    resolve(template, body, contentType)
  } catch (err) {
    if (err instanceof FencegateError) return err
    throw err
  }
  throw new Error('resolved')
}

describe('form bodies in entity templates', () => {
  it('reads bracket notation as nested fields and indexed arrays', () => {
    expect(resolve('customer:{body.metadata.external_id}', 'amount=100&metadata[external_id]=c_9&currency=usd')).toBe('customer:c_9')
    expect(resolve('price:{body.items.1.price}', 'items[0][price]=p_1&items[1][price]=p_2')).toBe('price:p_2')
    expect(resolve('c:{body.customer}', 'customer=cus%2DA')).toBe('c:cus-A')
    // Decoded whitespace (`%20`, `+`) is refused in an entity: an upstream may trim it and act on another id.
    expect(refusal('c:{body.customer}', 'customer=cus%20A+B').code).toBe('entity_unresolved')
    expect(resolve('c:{body.customer}', 'customer=cus_1', 'Application/X-WWW-Form-Urlencoded; charset=utf-8')).toBe('c:cus_1')
  })

  it('refuses what it refuses in JSON: missing, empty, or not a single value', () => {
    expect(refusal('c:{body.metadata.external_id}', 'amount=100').extras).toEqual({ source: 'body.metadata.external_id' })
    expect(refusal('c:{body.customer}', 'customer=').code).toBe('entity_unresolved')
    // A parent is not a value.
    expect(refusal('c:{body.metadata}', 'metadata[a]=1').code).toBe('unreadable_body')
    // Ambiguous: given twice, or both a value and a parent. The upstream might use either.
    expect(refusal('c:{body.customer}', 'customer=a&customer=b').code).toBe('unreadable_body')
    expect(refusal('c:{body.m.a}', 'm=1&m[a]=2').code).toBe('unreadable_body')
    expect(refusal('c:{body.m.a}', 'm[a]=2&m=1').code).toBe('unreadable_body')
    expect(refusal('c:{body.m.a}', 'm[a]=1&m[a]=2').code).toBe('unreadable_body')
    // Percent-encoded bytes that are not UTF-8 decode to U+FFFD, which no entity may hold.
    expect(refusal('c:{body.customer}', 'customer=%FF').code).toBe('entity_unresolved')
    // Control characters, as in JSON.
    expect(refusal('c:{body.customer}', 'customer=a%00b').code).toBe('entity_unresolved')
  })

  it('reads a form only when Content-Type says so, and JSON otherwise', () => {
    // Not JSON and not declared a form: unreadable, never read as naming nothing.
    expect(refusal('c:{body.customer}', 'customer=cus_1', 'application/json').code).toBe('unreadable_body')
    expect(resolve('c:{body.customer}', '{"customer":"cus_1"}', 'application/json')).toBe('c:cus_1')
    expect(isFormBody(null)).toBe(false)
    expect(isFormBody('multipart/form-data')).toBe(false)
  })

  it('cannot be steered through the prototype chain', () => {
    const tree = parseFormBody('__proto__[polluted]=yes&constructor[prototype][x]=1') as Record<string, unknown>
    expect(({} as Record<string, unknown>).polluted).toBeUndefined()
    expect(Object.getPrototypeOf(tree)).toBeNull()
    expect(refusal('c:{body.toString}', 'a=1').code).toBe('entity_unresolved')
  })
})

describe.each(backends())('a form-encoded route through the gateway on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway
  beforeAll(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    gw = await startTestGateway({
      config: testConfig([route(upstream.url, { name: 'intents', path: '/v1/payment_intents', entity: 'customer:{body.metadata.external_id}' })]),
      store: t.store,
    })
  })
  afterAll(async () => {
    await gw?.close()
    await upstream?.close()
    await t?.close()
  })

  it('fences per customer named in the form, and refuses a lower fence for that customer', async () => {
    const send = (fence: string, body: string) => post(`${gw.url}/v1/payment_intents`, fence, { body, headers: { 'content-type': form } })
    expect((await send('5', 'amount=100&metadata[external_id]=c_9')).status).toBe(200)
    const stale = await send('4', 'amount=200&metadata[external_id]=c_9')
    expect(stale.json).toMatchObject({ code: 'stale_fence', entity: 'customer:c_9' })
    expect((await send('1', 'amount=100&metadata[external_id]=c_10')).status).toBe(200)
    const missing = await send('6', 'amount=100')
    expect(missing.json).toMatchObject({ code: 'entity_unresolved', source: 'body.metadata.external_id' })
    // The upstream got the form bytes as sent.
    expect(upstream.received[0]!.body.toString()).toBe('amount=100&metadata[external_id]=c_9')
  })
})
