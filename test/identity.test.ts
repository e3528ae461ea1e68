import { exportJWK, exportSPKI, generateKeyPair, SignJWT, UnsecuredJWT } from 'jose'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { authSchema } from '../src/config/schema.js'
import { createAuthenticator } from '../src/http/identity.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { audience, bearer, hmacAuthenticator, issuer, jwtAuth, secret, token } from './helpers/tokens.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

describe.each(backends())('identity and tenants on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway
  let n = 0

  async function start(routes: Record<string, unknown>[]) {
    gw = await startTestGateway({ config: testConfig(routes, { auth: jwtAuth }), store: t.store, authenticate: await hmacAuthenticator() })
  }
  const capture = (id = '1') => `${gw.url}/payments/${id}/capture`
  const adminGet = async (path: string, headers: Record<string, string> = {}) => {
    const res = await fetch(`${gw.adminUrl}${path}`, { headers })
    return { status: res.status, json: await res.json() as any }
  }

  beforeEach(async () => {
    t = await backend.open()
    n = 0
    upstream = await startUpstream((req, res) => {
      n++
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ execution: n, auth: req.headers.authorization ?? null }))
    })
  })
  afterEach(async () => {
    await gw?.close()
    await upstream.close()
    await t.close()
  })

  it('answers 401 with a WWW-Authenticate challenge without a valid token, forwarding nothing', async () => {
    await start([route(upstream.url)])
    const other = new TextEncoder().encode('another-secret-of-at-least-32-bytes!!')
    const cases: [Record<string, string>, string | null][] = [
      [{}, 'Bearer realm="fencegate"'],
      [{ authorization: 'Basic dXNlcjpwYXNz' }, 'Bearer realm="fencegate", error="invalid_token"'],
      [{ authorization: `Bearer ${await token({}, { key: other })}` }, 'Bearer realm="fencegate", error="invalid_token"'],
      [{ authorization: `Bearer ${await token({}, { exp: Math.floor(Date.now() / 1000) - 3600 })}` }, 'Bearer realm="fencegate", error="invalid_token"'],
      [{ authorization: `Bearer ${await token({}, { iss: 'https://evil.test' })}` }, 'Bearer realm="fencegate", error="invalid_token"'],
      [{ authorization: `Bearer ${await token({}, { aud: 'someone-else' })}` }, 'Bearer realm="fencegate", error="invalid_token"'],
      [{ authorization: `Bearer ${new UnsecuredJWT({ tenant_id: 'acme' }).setIssuer(issuer).setAudience(audience).encode()}` }, 'Bearer realm="fencegate", error="invalid_token"'],
    ]
    for (const [headers, challenge] of cases) {
      const res = await post(capture(), '1', { headers })
      expect([res.status, res.json.code], JSON.stringify(headers)).toEqual([401, 'unauthenticated'])
      expect(res.headers.get('www-authenticate')).toBe(challenge)
    }
    expect(upstream.received).toHaveLength(0)
  })

  it('answers 403 tenant_missing for a valid token without the tenant claim', async () => {
    await start([route(upstream.url)])
    const res = await post(capture(), '1', { headers: await bearer({ tenant_id: undefined }) })
    expect([res.status, res.json.code]).toEqual([403, 'tenant_missing'])
  })

  it('refuses a tenant or subject the store could not hold (regression: NUL gave 503)', async () => {
    await start([route(upstream.url)])
    expect((await post(capture(), '1', { headers: await bearer({ tenant_id: 'a\u0000b' }) })).json.code).toBe('tenant_missing')
    expect((await post(capture(), '1', { headers: await bearer({ sub: 'w\u0000' }) })).json.code).toBe('unauthenticated')
    expect(upstream.received).toHaveLength(0)
  })

  it("keeps tenants apart: B's fence never blocks A, and B never gets A's replay", async () => {
    await start([route(upstream.url, { idempotency: 'optional' })])
    expect((await post(capture(), '10', { headers: await bearer({ tenant_id: 'a' }) })).status).toBe(200)
    expect((await post(capture(), '1', { headers: await bearer({ tenant_id: 'b' }) })).status).toBe(200)
    expect((await post(capture(), '9', { headers: await bearer({ tenant_id: 'a' }) })).json.code).toBe('stale_fence')
    const a = await post(capture('2'), '1', { headers: { ...(await bearer({ tenant_id: 'a' })), 'idempotency-key': 'shared' } })
    const b = await post(capture('2'), '1', { headers: { ...(await bearer({ tenant_id: 'b' })), 'idempotency-key': 'shared' } })
    expect(JSON.parse(a.text).execution).not.toBe(JSON.parse(b.text).execution)
    expect(b.headers.get('idempotent-replayed')).toBeNull()
    const bAgain = await post(capture('2'), '1', { headers: { ...(await bearer({ tenant_id: 'b' })), 'idempotency-key': 'shared' } })
    expect(bAgain.text).toBe(b.text)
    // A different body under the same key is reuse only within a tenant.
    const c = await post(capture('2'), '1', { body: '{"other":1}', headers: { ...(await bearer({ tenant_id: 'c' })), 'idempotency-key': 'shared' } })
    expect(c.status).toBe(200)
  })

  it('refuses a request that claims another tenant than its token (claimed_tenant), and audits it with the caller', async () => {
    await start([route(upstream.url, { claimed_tenant: 'body.tenant_id' }), route(upstream.url, { name: 'h', path: '/h/:invoice_id', claimed_tenant: 'header.X-Tenant-Id' })])
    const mismatch = await post(capture(), '1', { body: '{"tenant_id":"globex"}', headers: await bearer({ sub: 'agent-7' }) })
    expect([mismatch.status, mismatch.json.code]).toEqual([403, 'tenant_mismatch'])
    expect((await post(capture(), '1', { body: '{"tenant_id":"acme"}', headers: await bearer() })).status).toBe(200)
    expect((await post(capture(), '1', { body: '{}', headers: await bearer() })).status).toBe(200)
    expect((await post(`${gw.url}/h/1`, '1', { headers: { ...(await bearer()), 'x-tenant-id': 'globex' } })).json.code).toBe('tenant_mismatch')
    const rows = await adminGet('/audit?code=tenant_mismatch', await bearer({ scope: 'fencegate:admin' }))
    expect(rows.json.items).toMatchObject([{ tenant: 'acme', caller: 'worker-1' }, { tenant: 'acme', caller: 'agent-7' }])
    expect(upstream.received).toHaveLength(2)
  })

  it('gates routes by scope', async () => {
    await start([route(upstream.url, { scopes: ['payments:write'] })])
    const res = await post(capture(), '1', { headers: await bearer({ scope: 'payments:read' }) })
    expect([res.status, res.json.code]).toEqual([403, 'insufficient_scope'])
    expect((await post(capture(), '1', { headers: await bearer({ scope: 'payments:read payments:write' }) })).status).toBe(200)
    expect(upstream.received).toHaveLength(1)
  })

  it("does not forward the caller's Authorization unless the route says so, and injects the route's own", async () => {
    await start([
      route(upstream.url, { upstream_headers: { Authorization: 'Bearer upstream-key' } }),
      route(upstream.url, { name: 'plain', path: '/plain/:invoice_id' }),
      route(upstream.url, { name: 'pass', path: '/pass/:invoice_id', forward_authorization: true }),
    ])
    const headers = await bearer()
    expect(JSON.parse((await post(capture(), '1', { headers })).text).auth).toBe('Bearer upstream-key')
    expect(JSON.parse((await post(`${gw.url}/plain/1`, '1', { headers })).text).auth).toBeNull()
    expect(JSON.parse((await post(`${gw.url}/pass/1`, '1', { headers })).text).auth).toBe(headers.authorization)
  })

  it('requires a token on the admin plane: fencegate:admin sees all tenants, fencegate:audit only its own audit', async () => {
    await start([route(upstream.url)])
    await post(capture(), '5', { headers: await bearer({ tenant_id: 'a' }) })
    await post(capture(), '4', { headers: await bearer({ tenant_id: 'a' }) })
    await post(capture(), '5', { headers: await bearer({ tenant_id: 'b' }) })
    await post(capture(), '4', { headers: await bearer({ tenant_id: 'b' }) })
    expect((await adminGet('/audit')).status).toBe(401)
    expect((await fetch(`${gw.adminUrl}/health`)).status).toBe(200)
    const all = await adminGet('/audit', await bearer({ scope: 'fencegate:admin' }))
    expect(all.json.items.map((i: any) => i.tenant).sort()).toEqual(['a', 'b'])
    const own = await adminGet('/audit', await bearer({ tenant_id: 'a', scope: 'fencegate:audit' }))
    expect(own.json.items.map((i: any) => i.tenant)).toEqual(['a'])
    expect((await adminGet('/audit?tenant=b', await bearer({ tenant_id: 'a', scope: 'fencegate:audit' }))).json.code).toBe('insufficient_scope')
    expect((await adminGet('/entities/invoice:1', await bearer({ tenant_id: 'a', scope: 'fencegate:audit' }))).status).toBe(403)
    expect((await adminGet('/entities/invoice:1?tenant=b', await bearer({ scope: 'fencegate:admin' }))).json.highest_fence).toBe('5')
    expect((await adminGet('/audit', await bearer({ tenant_id: 'a' }))).status).toBe(403)
  })
})

describe('the caller', () => {
  // A subject longer than the 256 units kept was cut inside a surrogate pair: the lone half
  // went to the store as U+FFFD, and failed the JSON of a batch of fences (src/store/present.ts).
  it('keeps at most 256 UTF-16 units of the subject, never half of a surrogate pair', async () => {
    const authenticate = await hmacAuthenticator()
    const caller = async (sub: string) => (await authenticate(new Request('http://x/', { headers: await bearer({ sub }) }))).caller
    expect(await caller(`${'w'.repeat(255)}\u{1F600}tail`)).toBe('w'.repeat(255))
    expect(await caller(`${'w'.repeat(254)}\u{1F600}tail`)).toBe(`${'w'.repeat(254)}\u{1F600}`)
    expect(await caller('worker-1')).toBe('worker-1')
  })
})

describe('asymmetric keys', () => {
  it('verifies ES256 tokens from public_keys and refuses an HS256 token signed with the public key', async () => {
    const { publicKey, privateKey } = await generateKeyPair('ES256', { extractable: true })
    const pem = await exportSPKI(publicKey)
    const auth = authSchema.parse({ mode: 'jwt', issuer, audience, public_keys: [{ file: 'unused.pem', alg: 'ES256' }] })
    const authenticate = await createAuthenticator(auth, { kind: 'public', keys: [{ pem, alg: 'ES256' }] })
    const good = await new SignJWT({ tenant_id: 't' }).setProtectedHeader({ alg: 'ES256' }).setIssuer(issuer).setAudience(audience).setExpirationTime('1m').sign(privateKey)
    expect((await authenticate(new Request('http://x/', { headers: { authorization: `Bearer ${good}` } }))).tenant).toBe('t')
    // Algorithm confusion: an HMAC token whose "secret" is the public key's PEM.
    const confused = await new SignJWT({ tenant_id: 't' }).setProtectedHeader({ alg: 'HS256' }).setIssuer(issuer).setAudience(audience).setExpirationTime('1m').sign(new TextEncoder().encode(pem))
    await expect(authenticate(new Request('http://x/', { headers: { authorization: `Bearer ${confused}` } }))).rejects.toMatchObject({ code: 'unauthenticated' })
  })

  it('accepts a token signed by any configured key of its algorithm, whatever its kid (key rotation)', async () => {
    const pairs = await Promise.all([1, 2].map(() => generateKeyPair('ES256', { extractable: true })))
    const keys = await Promise.all(pairs.map(async (p) => ({ pem: await exportSPKI(p.publicKey), alg: 'ES256' })))
    const auth = authSchema.parse({ mode: 'jwt', issuer, audience, public_keys: [{ file: 'a.pem', alg: 'ES256' }, { file: 'b.pem', alg: 'ES256' }] })
    const authenticate = await createAuthenticator(auth, { kind: 'public', keys })
    for (const [i, p] of pairs.entries()) {
      const jwt = await new SignJWT({ tenant_id: `t${i}` }).setProtectedHeader({ alg: 'ES256', kid: `issuer-key-${i}` }).setIssuer(issuer).setAudience(audience).setExpirationTime('1m').sign(p.privateKey)
      expect((await authenticate(new Request('http://x/', { headers: { authorization: `Bearer ${jwt}` } }))).tenant).toBe(`t${i}`)
    }
    const stranger = await generateKeyPair('ES256')
    const forged = await new SignJWT({ tenant_id: 't' }).setProtectedHeader({ alg: 'ES256' }).setIssuer(issuer).setAudience(audience).setExpirationTime('1m').sign(stranger.privateKey)
    await expect(authenticate(new Request('http://x/', { headers: { authorization: `Bearer ${forged}` } }))).rejects.toMatchObject({ code: 'unauthenticated' })
  })

  it('requires exp and honours nbf with the clock tolerance', async () => {
    const authenticate = await hmacAuthenticator()
    const key = new TextEncoder().encode(secret)
    const base = () => new SignJWT({ tenant_id: 't' }).setProtectedHeader({ alg: 'HS256' }).setIssuer(issuer).setAudience(audience)
    const check = async (jwt: string) => authenticate(new Request('http://x/', { headers: { authorization: `Bearer ${jwt}` } }))
    await expect(check(await base().sign(key))).rejects.toMatchObject({ code: 'unauthenticated' })
    const now = Math.floor(Date.now() / 1000)
    await expect(check(await base().setExpirationTime('1m').setNotBefore(now + 60).sign(key))).rejects.toMatchObject({ code: 'unauthenticated' })
    // Default clock_tolerance is 5s: a token that becomes valid in 2s is accepted.
    expect((await check(await base().setExpirationTime('1m').setNotBefore(now + 2).sign(key))).tenant).toBe('t')
  })

  it('with auth.token_type, refuses a token of another typ: an ID token of the same issuer and audience passed before', async () => {
    const authenticate = await createAuthenticator(authSchema.parse({ ...jwtAuth, token_type: 'at+jwt' }), { kind: 'hmac', secret })
    const key = new TextEncoder().encode(secret)
    const signed = (typ?: string) => new SignJWT({ tenant_id: 't', sub: 'w' }).setProtectedHeader({ alg: 'HS256', ...(typ ? { typ } : {}) }).setIssuer(issuer).setAudience(audience).setExpirationTime('1m').sign(key)
    const check = async (jwt: string) => authenticate(new Request('http://x/', { headers: { authorization: `Bearer ${jwt}` } }))
    for (const typ of ['JWT', undefined]) await expect(check(await signed(typ))).rejects.toMatchObject({ code: 'unauthenticated', detail: "the token's typ claim is not accepted" })
    expect((await check(await signed('at+jwt'))).tenant).toBe('t')
    expect((await check(await signed('application/at+jwt'))).tenant).toBe('t')
  })

  it('fetches keys from jwks_url through jose and caches them', async () => {
    const { publicKey, privateKey } = await generateKeyPair('ES256', { extractable: true })
    const jwk = { ...(await exportJWK(publicKey)), kid: 'k1', alg: 'ES256' }
    let fetches = 0
    const jwks = createServer((_req, res) => {
      fetches++
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ keys: [jwk] }))
    })
    await new Promise<void>((resolve) => jwks.listen(0, '127.0.0.1', resolve))
    try {
      const url = `http://127.0.0.1:${(jwks.address() as AddressInfo).port}/jwks.json`
      const authenticate = await createAuthenticator(authSchema.parse({ mode: 'jwt', issuer, audience, jwks_url: url }), { kind: 'jwks', url })
      const sign = () => new SignJWT({ tenant_id: 't', scope: 'a b' }).setProtectedHeader({ alg: 'ES256', kid: 'k1' }).setIssuer(issuer).setAudience(audience).setExpirationTime('1m').sign(privateKey)
      for (let i = 0; i < 3; i++) {
        const identity = await authenticate(new Request('http://x/', { headers: { authorization: `Bearer ${await sign()}` } }))
        expect([identity.tenant, [...identity.scopes!]]).toEqual(['t', ['a', 'b']])
      }
      expect(fetches).toBe(1)
    } finally {
      jwks.close()
    }
  })

  it('refuses configuration that would weaken verification', () => {
    expect(authSchema.safeParse({ mode: 'jwt', issuer, audience, hs256_secret: 'short' }).success).toBe(false)
    expect(authSchema.safeParse({ mode: 'jwt', issuer, audience }).success).toBe(false)
    expect(authSchema.safeParse({ mode: 'jwt', issuer, audience, hs256_secret: secret, jwks_url: 'https://x/jwks' }).success).toBe(false)
    expect(authSchema.safeParse({ mode: 'jwt', audience, hs256_secret: secret }).success).toBe(false)
  })
})
