import { exportJWK, generateKeyPair, SignJWT, type CryptoKey, type JWK } from 'jose'
import { createServer, type Server, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { authSchema, ConfigError } from '../src/config/schema.js'
import { createAuthenticator, type Authenticate } from '../src/http/identity.js'
import type { KeySetOptions } from '../src/http/jwks.js'
import { startGateway } from '../src/runtime/node/gateway.js'
import { route, testConfig } from './helpers/gateway.js'
import { audience, issuer } from './helpers/tokens.js'

/** A real JWKS endpoint: publishes keys, rotates them, fails, hangs or goes away. */
class IdentityProvider {
  private keys: { kid: string; jwk: JWK; privateKey: CryptoKey }[] = []
  mode: 'up' | 'error' | 'hang' = 'up'
  fetches = 0
  private hanging: ServerResponse[] = []
  private waiters: { n: number; resolve: () => void }[] = []
  private server: Server = createServer((_req, res) => {
    this.fetches++
    this.waiters = this.waiters.filter((w) => (this.fetches >= w.n ? void w.resolve() : true))
    if (this.mode === 'hang') return void this.hanging.push(res)
    if (this.mode === 'error') return void res.writeHead(503).end()
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ keys: this.keys.map((k) => k.jwk) }))
  })
  url = ''

  /** Resolves once the endpoint has been asked `n` times in all. */
  fetched(n: number): Promise<void> {
    return this.fetches >= n ? Promise.resolve() : new Promise((resolve) => this.waiters.push({ n, resolve }))
  }

  async start(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve))
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}/.well-known/jwks.json`
  }

  /** Publishes a new key (the old ones stay published unless `retire`). */
  async rotate(kid: string, retire = false): Promise<void> {
    const { publicKey, privateKey } = await generateKeyPair('ES256', { extractable: true })
    if (retire) this.keys = []
    this.keys.push({ kid, jwk: { ...(await exportJWK(publicKey)), kid, alg: 'ES256' }, privateKey })
  }

  sign(kid: string): Promise<string> {
    const key = this.keys.find((k) => k.kid === kid)!
    return new SignJWT({ tenant_id: 't' }).setProtectedHeader({ alg: 'ES256', kid }).setIssuer(issuer).setAudience(audience)
      .setSubject('w').setExpirationTime('5m').sign(key.privateKey)
  }

  async stop(): Promise<void> {
    for (const res of this.hanging) res.destroy()
    this.server.closeAllConnections()
    await new Promise<void>((resolve) => this.server.close(() => resolve()))
  }
}

describe('a JWKS endpoint that rotates and goes down', () => {
  let idp: IdentityProvider
  let clock: number
  const auth = () => authSchema.parse({ mode: 'jwt', issuer, audience, jwks_url: idp.url })
  const authenticator = (keySet: KeySetOptions = {}) =>
    createAuthenticator(auth(), { kind: 'jwks', url: idp.url, keySet: { now: () => clock, ...keySet } })
  const check = async (authenticate: Authenticate, token: string) => {
    try {
      return { ok: true, tenant: (await authenticate({ headers: new Headers({ authorization: `Bearer ${token}` }) })).tenant }
    } catch (err) {
      return { ok: false, code: (err as { code?: string }).code, detail: (err as Error).message }
    }
  }

  beforeEach(async () => {
    idp = new IdentityProvider()
    await idp.start()
    await idp.rotate('k1')
    clock = 1_000_000
  })
  afterEach(() => idp.stop())

  it('verifies a newly published kid at its first use, one second after the last fetch, not 30 s later', async () => {
    const authenticate = await authenticator()
    expect(idp.fetches).toBe(1)
    await idp.rotate('k2', true)
    clock += 1000
    expect(await check(authenticate, await idp.sign('k2'))).toEqual({ ok: true, tenant: 't' })
    expect(idp.fetches).toBe(2)
    // A retired key stops verifying once a fetch no longer lists it.
    const k2 = await idp.sign('k2')
    await idp.rotate('k3', true)
    clock += 1000
    expect(await check(authenticate, await idp.sign('k3'))).toMatchObject({ ok: true })
    expect(await check(authenticate, k2)).toMatchObject({ ok: false, detail: 'no key matches the token' })
  })

  it('fetches at most once per second however many unknown kids arrive', async () => {
    const authenticate = await authenticator()
    await idp.rotate('k2')
    const forged = await Promise.all(Array.from({ length: 20 }, () => idp.sign('k2')))
    clock += 1000
    const answers = await Promise.all(forged.map((t) => check(authenticate, t)))
    expect(answers.every((a) => a.ok)).toBe(true)
    expect(idp.fetches).toBe(2)
    await idp.rotate('k4')
    // Within the interval an unknown kid is refused without a fetch.
    expect(await check(authenticate, await idp.sign('k4'))).toMatchObject({ ok: false, code: 'unauthenticated', detail: 'no key matches the token' })
    expect(idp.fetches).toBe(2)
  })

  it('keeps verifying keys already fetched while the key set is unreachable, without waiting for it', async () => {
    const authenticate = await authenticator()
    const token = await idp.sign('k1')
    idp.mode = 'hang'
    clock += 3_600_000
    // A stale set refreshes in the background: the request with a known key does not wait for the hanging fetch.
    expect(await check(authenticate, token)).toEqual({ ok: true, tenant: 't' })
    await idp.fetched(2)
    idp.mode = 'error'
    clock += 3_600_000
    expect(await check(authenticate, token)).toEqual({ ok: true, tenant: 't' })
  })

  it('says the key set could not be fetched when an unknown kid arrives while it is down', async () => {
    const authenticate = await authenticator()
    await idp.rotate('k2')
    const token = await idp.sign('k2')
    idp.mode = 'error'
    clock += 1000
    const refused = await check(authenticate, token)
    expect(refused).toMatchObject({ ok: false, code: 'unauthenticated' })
    expect(refused.detail).toContain('the key set could not be fetched (HTTP 503)')
    // Inside the interval the same answer, without another fetch.
    expect(await check(authenticate, token)).toEqual(refused)
    expect(idp.fetches).toBe(2)
    idp.mode = 'up'
    clock += 1000
    expect(await check(authenticate, token)).toMatchObject({ ok: true })
  })

  it('gives up on a fetch that hangs after the timeout, naming it', async () => {
    idp.mode = 'hang'
    const err = await authenticator({ timeoutMs: 200 }).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(ConfigError)
    expect((err as ConfigError).problems).toEqual([`auth.jwks_url: the key set could not be fetched (timed out) from ${idp.url}`])
  })

  it('stops the gateway at start when jwks_url cannot be fetched, naming auth.jwks_url', async () => {
    const url = idp.url
    await idp.stop()
    idp = new IdentityProvider()
    await idp.start()
    const config = testConfig([route('http://127.0.0.1:9')], { auth: { mode: 'jwt', issuer, audience, jwks_url: url } })
    const err = await startGateway({ config }).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(ConfigError)
    expect((err as ConfigError).problems[0]).toMatch(/^auth\.jwks_url: the key set could not be fetched \(connection failed: ECONNREFUSED\) from http:\/\/127\.0\.0\.1:\d+\//)
  })

  it('stops the gateway at start when jwks_url answers with something other than a key set', async () => {
    idp.mode = 'error'
    const err = await createAuthenticator(auth(), { kind: 'jwks', url: idp.url }).catch((e: unknown) => e)
    expect((err as ConfigError).problems).toEqual([`auth.jwks_url: the key set could not be fetched (HTTP 503) from ${idp.url}`])
  })
})
