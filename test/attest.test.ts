import { createHash } from 'node:crypto'
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { exportPKCS8, exportSPKI, generateKeyPair } from 'jose'
import { afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import { createAdminApp } from '../src/admin/app.js'
import { createDataPlane } from '../src/gateway/app.js'
import { createAttestationSigner, type AttestationSigner } from '../src/gateway/attest.js'
import { ConfigError, parseConfig, type Config } from '../src/config/schema.js'
import { upstreamRequestHeaders } from '../src/gateway/forward.js'
import { silentLogger } from '../src/observe/log.js'
import { attestationSigner, dataPlaneListener, listen } from '../src/runtime/node/gateway.js'
import { createUndiciForward } from '../src/runtime/node/forward.js'
import { startRuleRegistry } from '../src/rules/registry.js'
import { RuleError, validateRuleSet } from '../src/rules/schema.js'
import { AttestationError, verifyAttestation, type AttestationClaims, type VerifyAttestationOptions } from '../src/verify/index.js'
import { workerAttestationSigner } from '../src/runtime/workers/bindings.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, testConfig } from './helpers/gateway.js'
import { runCli, startGatewayProcess, writeConfig } from './helpers/process.js'
import { startUpstream, type ReceivedRequest, type TestUpstream } from './helpers/upstream.js'

const sha256 = (data: string | Uint8Array) => createHash('sha256').update(data).digest('hex')
const section = { key_file: 'attest.pem', alg: 'ES256', kid: 'gw-2024' }
let keys: { privatePem: string; publicPem: string; otherPublicPem: string }

beforeAll(async () => {
  const [mine, other] = await Promise.all([generateKeyPair('ES256', { extractable: true }), generateKeyPair('ES256', { extractable: true })])
  keys = { privatePem: await exportPKCS8(mine.privateKey), publicPem: await exportSPKI(mine.publicKey), otherPublicPem: await exportSPKI(other.publicKey) }
})

/** The data plane with an injected signer, served over loopback as node.ts serves it. */
async function startGateway(config: Config, store: TestDb['store'], attest: AttestationSigner | undefined) {
  const undici = createUndiciForward()
  const plane = createDataPlane({ config, store, forward: undici.forward, ...(attest ? { attest } : {}) })
  const server = await listen(dataPlaneListener(plane, silentLogger), '127.0.0.1', 0, config.server)
  return {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
    close: async () => {
      await new Promise<void>((resolve) => {
        server.close(() => resolve())
        if ('closeAllConnections' in server) server.closeAllConnections()
      })
      await undici.close()
    },
  }
}

/** What the upstream checks: the received request, exactly as it arrived. */
const checksOf = (req: ReceivedRequest): NonNullable<VerifyAttestationOptions['request']> => ({
  method: req.method, path: req.path, body: req.body,
  fence: (req.headers['x-execution-fence'] as string | undefined) ?? null, idempotencyKey: (req.headers['idempotency-key'] as string | undefined) ?? null,
})

describe.each(backends())('signed fence attestation ($name)', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: Awaited<ReturnType<typeof startGateway>>
  let config: Config
  // What the upstream's verifier said about each request it received.
  let verdicts: (AttestationClaims | { code: string; field?: string } | 'none')[]

  const audience = () => upstream.url
  async function start(clock?: () => number) {
    config = testConfig([
      route(upstream.url + '/v1', { attest: true, idempotency: 'optional' }),
      route(upstream.url, { name: 'plain', path: '/plain/:invoice_id', upstream_headers: { 'Fence-Attestation': 'from.the.config' } }),
      route(upstream.url, { name: 'open', path: '/open', fence: 'off', entity: undefined }),
      route(upstream.url, { name: 'maybe', path: '/maybe/:invoice_id', fence: 'optional', attest: true }),
      // Its entity is read from the very header a client might forge.
      route(upstream.url, { name: 'by-header', path: '/by-header', entity: 'x:{header.Fence-Attestation}' }),
    ], { attestation: section })
    gw = await startGateway(config, t.store, await createAttestationSigner(config.attestation!, keys.privatePem, clock ? { now: clock } : {}))
  }

  beforeEach(async () => {
    t = await backend.open()
    verdicts = []
    upstream = await startUpstream(async (req, res) => {
      const header = req.headers['fence-attestation'] as string | undefined
      const verdict = header === undefined ? 'none' as const : await verifyAttestation(header, { key: keys.publicPem, audience: audience(), request: checksOf(req) })
        .catch((e: AttestationError) => ({ code: e.code, ...(e.field ? { field: e.field } : {}) }))
      verdicts.push(verdict)
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ attestation: header ?? null }))
    })
  })
  afterEach(async () => {
    await gw?.close()
    await upstream.close()
    await t.close()
  })

  it('an upstream verifies the attestation with the public key, and its claims are the command', async () => {
    await start()
    const body = '{"amount":1299}'
    const res = await post(`${gw.url}/payments/42/capture?currency=eur`, '007', { body, headers: { 'idempotency-key': 'k-1', 'x-request-id': 'req-1' } })
    expect(res.status).toBe(200)
    expect(verdicts).toHaveLength(1)
    expect(verdicts[0]).toMatchObject({
      iss: 'fencegate', aud: upstream.url, tenant: 'default', entity: 'invoice:42', fence: '7', idempotency_key: 'k-1',
      body_sha256: sha256(body), method: 'POST', path: '/v1/payments/42/capture?currency=eur', route: 'capture', request_id: 'req-1',
    })
    const claims = verdicts[0] as AttestationClaims
    expect(claims.exp - claims.iat).toBe(60)
    expect(upstream.received[0]!.path).toBe('/v1/payments/42/capture?currency=eur')
  })

  it('gives each attestation a jti of its own: two commands with the same X-Request-Id, and a replayed header, are told apart', async () => {
    await start()
    // A client chooses its X-Request-Id: two different commands may carry the same one.
    await post(`${gw.url}/payments/1/capture`, '1', { headers: { 'x-request-id': 'same' } })
    await post(`${gw.url}/payments/2/capture`, '1', { headers: { 'x-request-id': 'same' } })
    const [a, b] = verdicts as AttestationClaims[]
    expect([a!.request_id, b!.request_id]).toEqual(['same', 'same'])
    expect(a!.jti).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
    expect(b!.jti).not.toBe(a!.jti)
    // The upstream's replay check on jti lets both commands through, and refuses the first one's header sent again.
    const ids = new Set<string>()
    const seen = (jti: string) => ids.has(jti) || (ids.add(jti), false)
    const check = (req: ReceivedRequest) => verifyAttestation(req.headers['fence-attestation'] as string, { key: keys.publicPem, audience: audience(), request: checksOf(req), seen })
      .then((c) => c.entity, (e: AttestationError) => e.code)
    const [first, second] = upstream.received
    expect([await check(first!), await check(second!), await check(first!)]).toEqual(['invoice:1', 'invoice:2', 'replayed'])
  })

  it('adds no attestation on routes without attest, or when no fence was checked', async () => {
    await start()
    expect((await post(`${gw.url}/plain/1`, '1')).status).toBe(200)
    expect((await post(`${gw.url}/open`)).status).toBe(200)
    expect((await post(`${gw.url}/maybe/1`)).status).toBe(200)
    expect((await post(`${gw.url}/maybe/2`, '1')).status).toBe(200)
    expect(verdicts.slice(0, 3)).toEqual(['none', 'none', 'none'])
    expect(verdicts[3]).toMatchObject({ entity: 'invoice:2', fence: '1', route: 'maybe' })
  })

  it('never passes a client-sent Fence-Attestation to the upstream, on any route', async () => {
    await start()
    const forged = { 'fence-attestation': 'forged.by.client' }
    await post(`${gw.url}/payments/1/capture`, '1', { headers: forged })
    await post(`${gw.url}/plain/1`, '1', { headers: forged })
    await post(`${gw.url}/open`, undefined, { headers: forged })
    await post(`${gw.url}/maybe/1`, undefined, { headers: forged })
    await post(`${gw.url}/by-header`, '1', { headers: forged })
    expect(upstream.received).toHaveLength(5)
    const sent = upstream.received.map((r) => r.headers['fence-attestation'] ?? 'none')
    expect(sent.filter((h) => h === 'forged.by.client' || h === 'from.the.config')).toEqual([])
    // The attesting route carries the gateway's own, which verifies; the rest carry none, even
    // the route whose entity is read from that header (decision headers are re-set after filtering).
    expect(verdicts[0]).toMatchObject({ entity: 'invoice:1' })
    expect(verdicts.slice(1)).toEqual(['none', 'none', 'none', 'none'])
  })

  it('rejects a tampered body, another path, method, fence or key, another audience and another key', async () => {
    await start()
    const body = '{"amount":1}'
    const res = await post(`${gw.url}/payments/9/capture`, '3', { body, headers: { 'idempotency-key': 'k-9' } })
    const jws = res.json.attestation as string
    const request = { method: 'POST', path: '/v1/payments/9/capture', body, fence: '3', idempotencyKey: 'k-9' }
    const options = { key: keys.publicPem, audience: upstream.url, request }
    await expect(verifyAttestation(jws, options)).resolves.toMatchObject({ fence: '3' })
    const refused = (o: VerifyAttestationOptions, token = jws) => verifyAttestation(token, o).then(() => 'accepted', (e: AttestationError) => `${e.code}${e.field ? `:${e.field}` : ''}`)
    expect(await refused({ ...options, request: { ...request, body: '{"amount":1000}' } })).toBe('mismatch:body_sha256')
    expect(await refused({ ...options, request: { ...request, body: new TextEncoder().encode(body + ' ') } })).toBe('mismatch:body_sha256')
    expect(await refused({ ...options, request: { ...request, path: '/v1/payments/10/capture' } })).toBe('mismatch:path')
    expect(await refused({ ...options, request: { ...request, method: 'PUT' } })).toBe('mismatch:method')
    expect(await refused({ ...options, request: { ...request, fence: '4' } })).toBe('mismatch:fence')
    expect(await refused({ ...options, request: { ...request, fence: null } })).toBe('mismatch:fence')
    expect(await refused({ ...options, request: { ...request, idempotencyKey: null } })).toBe('mismatch:idempotency_key')
    expect(await refused({ ...options, audience: 'http://127.0.0.1:1' })).toBe('wrong_audience')
    expect(await refused({ ...options, issuer: 'another-gateway' })).toBe('wrong_issuer')
    expect(await refused({ ...options, key: keys.otherPublicPem })).toBe('bad_signature')
    const [h, p, s] = jws.split('.')
    const claims = JSON.parse(Buffer.from(p!, 'base64url').toString())
    const forgedPayload = Buffer.from(JSON.stringify({ ...claims, fence: '99' })).toString('base64url')
    expect(await refused(options, `${h}.${forgedPayload}.${s}`)).toBe('bad_signature')
    expect(await refused(options, 'not-a-jws')).toBe('malformed')
  })

  it('an attestation signed by an injected past clock reaches the upstream expired, and is rejected there', async () => {
    await start(() => Date.now() - 10 * 60_000)
    expect((await post(`${gw.url}/payments/1/capture`, '1')).status).toBe(200)
    expect(verdicts).toEqual([{ code: 'expired' }])
  })

  it('a stale fence never produces an attestation: nothing is forwarded', async () => {
    await start()
    expect((await post(`${gw.url}/payments/5/capture`, '5')).status).toBe(200)
    const stale = await post(`${gw.url}/payments/5/capture`, '4', { headers: { 'fence-attestation': 'forged.by.client' } })
    expect([stale.status, stale.json.code]).toEqual([409, 'stale_fence'])
    expect(upstream.received).toHaveLength(1)
    expect(verdicts).toHaveLength(1)
    expect(verdicts[0]).toMatchObject({ fence: '5' })
  })

  it('an app built without a signer fails closed on an attesting route: nothing forwarded, the key released', async () => {
    await start()
    await gw.close()
    gw = await startGateway(config, t.store, undefined)
    for (let i = 0; i < 2; i++) {
      const res = await post(`${gw.url}/payments/1/capture`, '1', { headers: { 'idempotency-key': 'k-unsigned' } })
      expect([res.status, res.json.code]).toEqual([500, 'internal_error'])
    }
    expect(upstream.received).toEqual([])
  })

  it('refuses a rule with attest: true on a gateway without an attestation key', async () => {
    const keyless = testConfig([route(upstream.url)])
    const registry = await startRuleRegistry({ db: t.db, config: keyless, log: silentLogger })
    try {
      const change = registry.change({ name: 'signed', rule: route(upstream.url, { name: 'signed', path: '/signed/:invoice_id', attest: true }) as never, changedBy: null, source: 'api' })
      await expect(change).rejects.toThrow(RuleError)
      await expect(change).rejects.toThrow(/signed: attest: attest needs the gateway's attestation section/)
      const admin = createAdminApp({ store: t.store, rules: { registry, db: t.db } })
      const res = await admin.request('/rules/signed', { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify(route(upstream.url, { name: 'signed', path: '/signed/:invoice_id', attest: true })) })
      expect([res.status, ((await res.json()) as { code: string }).code]).toEqual([422, 'invalid_rule'])
    } finally {
      await registry.close()
    }
    // A gateway with a key may store it; a keyless one sharing the database then refuses to start on it.
    const keyed = await startRuleRegistry({ db: t.db, config: testConfig([route(upstream.url)], { attestation: section }), log: silentLogger })
    await keyed.change({ name: 'signed', rule: route(upstream.url, { name: 'signed', path: '/signed/:invoice_id', attest: true }) as never, changedBy: null, source: 'api' })
    await keyed.close()
    await expect(startRuleRegistry({ db: t.db, config: keyless, log: silentLogger })).rejects.toThrow(/attest needs the gateway's attestation section/)
  })
})

describe('Fence-Attestation from a client', () => {
  it('strips a client Fence-Attestation in the upstream request-header filter', () => {
    const out = upstreamRequestHeaders(new Headers({ 'Fence-Attestation': 'forged', 'x-execution-fence': '1' }))
    expect([out.get('fence-attestation'), out.get('x-execution-fence')]).toEqual([null, '1'])
  })
})

describe('attestation configuration', () => {
  const problems = (input: Record<string, unknown>) => {
    try {
      parseConfig(input)
      return []
    } catch (e) {
      return (e as ConfigError).problems
    }
  }

  it('defaults attest to false, ttl to 60s and issuer to fencegate', () => {
    const c = parseConfig({ routes: [route('http://127.0.0.1:1')], attestation: section })
    expect(c.routes[0]!.attest).toBe(false)
    expect(c.attestation).toEqual({ ...section, ttl: 60_000, issuer: 'fencegate' })
    expect(parseConfig({ routes: [route('http://127.0.0.1:1')] }).attestation).toBeUndefined()
  })

  it('refuses attest without a key, attest on a route without a fence, and a ttl over 10m', () => {
    expect(problems({ routes: [route('http://127.0.0.1:1', { attest: true })] })).toEqual(["routes[0].attest: attest needs the gateway's attestation section (its signing key)"])
    expect(problems({ routes: [route('http://127.0.0.1:1', { attest: true, fence: 'off', entity: undefined })], attestation: section }))
      .toEqual(['routes[0].attest: attest needs a fence check: set fence to required, optional or lease'])
    expect(problems({ routes: [route('http://127.0.0.1:1')], attestation: { ...section, ttl: '11m' } })).toEqual(['attestation.ttl: must be at most 10m'])
    expect(problems({ routes: [route('http://127.0.0.1:1')], attestation: { ...section, alg: 'HS256' } })).toHaveLength(1)
    expect(problems({ routes: [route('http://127.0.0.1:1')], attestation: { key_file: 'k.pem', alg: 'ES256' } })).toEqual([expect.stringMatching(/^attestation\.kid: /)])
    expect(() => validateRuleSet([route('http://127.0.0.1:1', { attest: true }) as never], 'none', false)).toThrow(/attest needs the gateway's attestation section/)
  })

  it('fails loudly on a missing key file, a public key, or a key of another algorithm', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'fencegate-attest-'))
    const file = (name: string, text: string) => (writeFileSync(join(dir, name), text), join(dir, name))
    const ed = await generateKeyPair('EdDSA', { extractable: true })
    const cases: [string, string][] = [
      [join(dir, 'missing.pem'), 'cannot read'],
      [file('public.pem', keys.publicPem), 'is not a PEM PKCS#8 private key'],
      [file('ed.pem', await exportPKCS8(ed.privateKey)), 'is not a PEM PKCS#8 private key ("BEGIN PRIVATE KEY") for ES256'],
    ]
    for (const [keyFile, message] of cases) {
      const config = parseConfig({ routes: [route('http://127.0.0.1:1')], attestation: { ...section, key_file: keyFile } })
      await expect(attestationSigner(config)).rejects.toThrow(ConfigError)
      await expect(attestationSigner(config)).rejects.toThrow(message)
    }
    await expect(attestationSigner(parseConfig({ routes: [route('http://127.0.0.1:1')] }))).resolves.toBeUndefined()
    const withSection = parseConfig({ routes: [route('http://127.0.0.1:1')], attestation: section })
    await expect(workerAttestationSigner(withSection, {})).rejects.toThrow(/FENCEGATE_ATTESTATION_KEY: not set/)
    await expect(workerAttestationSigner(withSection, { FENCEGATE_ATTESTATION_KEY: keys.publicPem })).rejects.toThrow(ConfigError)
    await expect(workerAttestationSigner(withSection, { FENCEGATE_ATTESTATION_KEY: keys.privatePem })).resolves.toBeTypeOf('function')
  })

  it('fencegate serve signs with the key file its configuration names', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'fencegate-attest-'))
    writeFileSync(join(dir, 'attest.pem'), keys.privatePem)
    const upstream = await startUpstream()
    const configFile = writeConfig({
      routes: [route(upstream.url, { attest: true })], attestation: { ...section, key_file: join(dir, 'attest.pem'), ttl: '2m', issuer: 'gw-a' },
      server: { port: 0, admin_port: 0 },
    })
    const gateway = await startGatewayProcess(['--config', configFile, '--data-dir', join(dir, 'store')])
    try {
      expect((await post(`${gateway.dataUrl}/payments/3/capture`, '2', { body: '{}' })).status).toBe(200)
      const req = upstream.received[0]!
      const claims = await verifyAttestation(req.headers['fence-attestation'] as string, { key: keys.publicPem, issuer: 'gw-a', audience: upstream.url, request: checksOf(req) })
      expect([claims.entity, claims.fence, claims.exp - claims.iat]).toEqual(['invoice:3', '2', 120])
    } finally {
      await gateway.stop()
      await upstream.close()
    }
  })

  it('fencegate serve exits 2 on a bad key file before it opens the store', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'fencegate-attest-'))
    const configFile = writeConfig({ routes: [route('http://127.0.0.1:1', { attest: true })], attestation: { ...section, key_file: join(dir, 'missing.pem') }, server: { port: 0, admin_port: 0 } })
    const result = await runCli(['serve', '--config', configFile, '--data-dir', join(dir, 'store')])
    expect(result.code).toBe(2)
    expect(result.stderr).toContain('attestation.key_file: cannot read')
    expect(existsSync(join(dir, 'store'))).toBe(false)
  })
})
