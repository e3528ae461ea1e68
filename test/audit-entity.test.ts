import { describe, expect, it } from 'vitest'
import { backends } from './helpers/backends.js'
import { freshGateway } from './helpers/fresh-gateway.js'
import { post, route, testConfig } from './helpers/gateway.js'
import { bearer, hmacAuthenticator, jwtAuth } from './helpers/tokens.js'

describe.each(backends())('audit rows name the entity whenever it resolves ($name)', (backend) => {
  const fx = freshGateway(backend, async ({ upstream }) => ({
    config: testConfig([
      route(upstream.url),
      route(upstream.url, { name: 'keyed', path: '/keyed/:invoice_id', idempotency: 'required', fence: 'optional' }),
      route(upstream.url, { name: 'by-body', path: '/refunds', entity: 'invoice:{body.invoice}' }),
      route(upstream.url, { name: 'scoped', path: '/scoped/:invoice_id', scopes: ['payments:write'] }),
    ], { auth: jwtAuth }),
    authenticate: await hmacAuthenticator(),
  }))

  const auditOf = async (requestId: string) => (await fx.t.store.listAudit({ limit: 1000 })).find((a) => a.request_id === requestId)
  const send = async (path: string, fence: string | undefined, requestId: string, body = '{}', claims: Record<string, unknown> = {}) =>
    post(`${fx.gw.url}${path}`, fence, { body, headers: { 'x-request-id': requestId, ...(await bearer({ scope: 'payments:write', ...claims })) } })

  it('invalid_fence and fence_required carry the entity of the route\'s template', async () => {
    expect((await send('/payments/42/capture', 'not-a-fence', 'bad')).json.code).toBe('invalid_fence')
    expect((await send('/payments/42/capture', undefined, 'missing')).json.code).toBe('fence_required')
    expect(await auditOf('bad')).toMatchObject({ code: 'invalid_fence', entity: 'invoice:42', route: 'capture', caller: 'worker-1', tenant: 'acme' })
    expect(await auditOf('missing')).toMatchObject({ code: 'fence_required', entity: 'invoice:42' })
    const byEntity = await fx.t.store.listAudit({ limit: 10, entity: 'invoice:42' })
    expect(byEntity.map((a) => a.request_id).sort()).toEqual(['bad', 'missing'])
  })

  it('resolves an entity read from the body, and other refusals after routing name it too', async () => {
    expect((await send('/refunds', 'x', 'body', '{"invoice":"9"}')).json.code).toBe('invalid_fence')
    expect((await send('/keyed/5', '1', 'no-key')).json.code).toBe('idempotency_key_required')
    expect((await send('/scoped/6', '1', 'scope', '{}', { scope: 'other' })).json.code).toBe('insufficient_scope')
    expect(await auditOf('body')).toMatchObject({ entity: 'invoice:9' })
    expect(await auditOf('no-key')).toMatchObject({ entity: 'invoice:5' })
    expect(await auditOf('scope')).toMatchObject({ code: 'insufficient_scope', entity: 'invoice:6' })
  })

  it('leaves the entity null when the template does not resolve', async () => {
    expect((await send('/refunds', 'x', 'unresolved', '{"other":1}')).json.code).toBe('invalid_fence')
    expect(await auditOf('unresolved')).toMatchObject({ code: 'invalid_fence', entity: null })
  })

  it('filters the audit trail by caller', async () => {
    await send('/payments/42/capture', 'x', 'from-a', '{}', { sub: 'worker-a' })
    await send('/payments/42/capture', 'x', 'from-b', '{}', { sub: 'worker-b' })
    const res = await fetch(`${fx.gw.adminUrl}/audit?caller=worker-b`, { headers: await bearer({ scope: 'fencegate:admin' }) })
    expect(((await res.json()) as any).items.map((i: any) => i.request_id)).toEqual(['from-b'])
  })
})
