import { execFile } from 'node:child_process'
import { createHash } from 'node:crypto'
import { readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { createLocalJWKSet, exportJWK, exportPKCS8, exportSPKI, generateKeyPair, importPKCS8, SignJWT, UnsecuredJWT } from 'jose'
import { beforeAll, describe, expect, it } from 'vitest'
import { createAttestationSigner } from '../src/gateway/attest.js'
import { parseConfig } from '../src/config/schema.js'
import { AttestationError, verifyAttestation } from '../src/verify/index.js'
import { route } from './helpers/gateway.js'

// The verifier on its own: keys, algorithms and clocks. The gateway's side is in attest.test.ts.
const sha256 = (data: string | Uint8Array) => createHash('sha256').update(data).digest('hex')
const section = { key_file: 'attest.pem', alg: 'ES256', kid: 'gw-2024' } as const
let keys: { privatePem: string; publicPem: string }

beforeAll(async () => {
  const mine = await generateKeyPair('ES256', { extractable: true })
  keys = { privatePem: await exportPKCS8(mine.privateKey), publicPem: await exportSPKI(mine.publicKey) }
})

describe('attestation keys and algorithms', () => {
  const facts = { tenant: 't', entity: 'e:1', fence: '1', idempotencyKey: null, bodySha256: sha256(''), method: 'POST', path: '/x', route: 'r', requestId: 'q', audience: 'https://up.example' }
  it('verifies an EdDSA attestation, and picks the key by kid from a key set (rotation)', async () => {
    const [old, next] = await Promise.all([generateKeyPair('EdDSA', { extractable: true }), generateKeyPair('ES256', { extractable: true })])
    const oldJws = await (await createAttestationSigner({ ...section, alg: 'EdDSA', kid: 'old', ttl: 60_000, issuer: 'fencegate' }, await exportPKCS8(old.privateKey)))(facts)
    const nextJws = await (await createAttestationSigner({ ...section, alg: 'ES256', kid: 'next', ttl: 60_000, issuer: 'fencegate' }, await exportPKCS8(next.privateKey)))(facts)
    await expect(verifyAttestation(oldJws, { key: await exportSPKI(old.publicKey), audience: 'https://up.example', request: { method: 'POST', path: '/x', body: '' } })).resolves.toMatchObject({ entity: 'e:1' })
    const set = createLocalJWKSet({ keys: [{ ...await exportJWK(old.publicKey), kid: 'old' }, { ...await exportJWK(next.publicKey), kid: 'next' }] })
    await expect(verifyAttestation(oldJws, { key: set, audience: 'https://up.example' })).resolves.toMatchObject({ fence: '1' })
    await expect(verifyAttestation(nextJws, { key: set, audience: 'https://up.example' })).resolves.toMatchObject({ fence: '1' })
    const retired = createLocalJWKSet({ keys: [{ ...await exportJWK(next.publicKey), kid: 'next' }] })
    await expect(verifyAttestation(oldJws, { key: retired, audience: 'https://up.example' })).rejects.toMatchObject({ code: 'unknown_key' })
  })

  it('refuses another typ, alg none and HMAC, even for the same claims', async () => {
    const claims = { tenant: 't', entity: 'e:1', fence: '1', idempotency_key: null, body_sha256: sha256(''), method: 'POST', path: '/x', route: 'r', request_id: 'q', jti: 'j' }
    const build = () => new SignJWT(claims).setIssuer('fencegate').setAudience('https://up.example').setIssuedAt().setExpirationTime('1m')
    const options = { key: keys.publicPem, audience: 'https://up.example' }
    await expect(verifyAttestation(await build().setProtectedHeader({ alg: 'ES256', typ: 'fence-attestation+jwt' }).sign(await importPKCS8(keys.privatePem, 'ES256')), options)).resolves.toMatchObject({ entity: 'e:1' })
    await expect(verifyAttestation(await build().setProtectedHeader({ alg: 'ES256', typ: 'JWT' }).sign(await importPKCS8(keys.privatePem, 'ES256')), options)).rejects.toMatchObject({ code: 'malformed' })
    await expect(verifyAttestation(await build().setProtectedHeader({ alg: 'HS256', typ: 'fence-attestation+jwt' }).sign(new TextEncoder().encode(keys.publicPem)), options)).rejects.toMatchObject({ code: 'bad_signature' })
    const unsecured = new UnsecuredJWT(claims).setIssuer('fencegate').setAudience('https://up.example').setIssuedAt().setExpirationTime('1m').encode()
    await expect(verifyAttestation(unsecured, options)).rejects.toMatchObject({ code: 'bad_signature' })
  })

  it('allows clockToleranceMs (default 5 s) past exp, by the verifier clock', async () => {
    const signedAt = Date.UTC(2030, 0, 1)
    const jws = await (await createAttestationSigner({ ...section, alg: 'ES256', ttl: 60_000, issuer: 'fencegate' }, keys.privatePem, { now: () => signedAt }))(facts)
    const at = (s: number, tolerance?: number) => verifyAttestation(jws, { key: keys.publicPem, audience: 'https://up.example', now: new Date(signedAt + s * 1000), ...(tolerance === undefined ? {} : { clockToleranceMs: tolerance }) })
      .then(() => 'accepted', (e: AttestationError) => e.code)
    expect([await at(59), await at(64), await at(66), await at(61, 0), await at(61, 2000)]).toEqual(['accepted', 'accepted', 'expired', 'expired', 'accepted'])
    // A ttl in milliseconds is rounded up to whole seconds.
    const short = await (await createAttestationSigner({ ...section, alg: 'ES256', ttl: 1500, issuer: 'fencegate' }, keys.privatePem, { now: () => signedAt }))(facts)
    const claims = await verifyAttestation(short, { key: keys.publicPem, audience: 'https://up.example', now: new Date(signedAt) })
    expect(claims.exp - claims.iat).toBe(2)
  })

  it('refuses an attestation older than maxAgeMs, or issued in the future', async () => {
    const config = parseConfig({ routes: [route('http://127.0.0.1:1')], attestation: { ...section, ttl: '10m' } }).attestation!
    const signedAt = Date.UTC(2030, 0, 1)
    const jws = await (await createAttestationSigner(config, keys.privatePem, { now: () => signedAt }))(facts)
    const at = (s: number, maxAgeMs?: number) => verifyAttestation(jws, { key: keys.publicPem, audience: 'https://up.example', now: new Date(signedAt + s * 1000), ...(maxAgeMs === undefined ? {} : { maxAgeMs }) })
      .then(() => 'accepted', (e: AttestationError) => e.code)
    expect([await at(60), await at(60, 10_000), await at(9, 10_000), await at(-60, 600_000)]).toEqual(['accepted', 'expired', 'accepted', 'not_yet_valid'])
  })
})

describe('the replay check on jti', () => {
  const facts = { tenant: 't', entity: 'e:1', fence: '1', idempotencyKey: null, bodySha256: sha256(''), method: 'POST', path: '/x', route: 'r', requestId: 'q', audience: 'https://up.example' }
  const options = { audience: 'https://up.example', request: { method: 'POST', path: '/x', body: '' } }

  it('refuses an attestation its seen check knew as replayed; it is asked with the jti and exp, sync or async', async () => {
    const sign = await createAttestationSigner({ ...section, ttl: 60_000, issuer: 'fencegate' }, keys.privatePem)
    const jws = await sign(facts)
    const asked: [string, number][] = []
    const ids = new Map<string, number>()
    const seen = async (jti: string, exp: number) => {
      asked.push([jti, exp])
      if (ids.has(jti)) return true
      ids.set(jti, exp)
      return false
    }
    const first = await verifyAttestation(jws, { key: keys.publicPem, ...options, seen })
    const again = await verifyAttestation(jws, { key: keys.publicPem, ...options, seen }).catch((e: AttestationError) => e)
    expect(again).toBeInstanceOf(AttestationError)
    expect((again as AttestationError).code).toBe('replayed')
    expect(asked).toEqual([[first.jti, first.exp], [first.jti, first.exp]])
    // The same facts signed again are another attestation, with another jti.
    const other = await verifyAttestation(await sign(facts), { key: keys.publicPem, ...options, seen: (jti) => ids.has(jti) })
    expect(other.jti).not.toBe(first.jti)
  })

  it('asks seen only once every other check passed, so a forged or mismatched attestation records nothing', async () => {
    const jws = await (await createAttestationSigner({ ...section, ttl: 60_000, issuer: 'fencegate' }, keys.privatePem))(facts)
    const asked: string[] = []
    const seen = (jti: string) => (asked.push(jti), false)
    const other = await generateKeyPair('ES256', { extractable: true })
    const refused = await Promise.all([
      verifyAttestation(jws, { key: await exportSPKI(other.publicKey), ...options, seen }),
      verifyAttestation(jws, { key: keys.publicPem, ...options, request: { ...options.request, body: 'x' }, seen }),
      verifyAttestation(jws, { key: keys.publicPem, ...options, audience: 'https://other.example', seen }),
    ].map((p) => p.then(() => 'accepted', (e: AttestationError) => e.code)))
    expect(refused).toEqual(['bad_signature', 'mismatch', 'wrong_audience'])
    expect(asked).toEqual([])
  })

  it('refuses an attestation without a jti as malformed', async () => {
    const claims = { tenant: 't', entity: 'e:1', fence: '1', idempotency_key: null, body_sha256: sha256(''), method: 'POST', path: '/x', route: 'r', request_id: 'q' }
    const jws = await new SignJWT(claims).setIssuer('fencegate').setAudience('https://up.example').setIssuedAt().setExpirationTime('1m')
      .setProtectedHeader({ alg: 'ES256', typ: 'fence-attestation+jwt' }).sign(await importPKCS8(keys.privatePem, 'ES256'))
    await expect(verifyAttestation(jws, { key: keys.publicPem, audience: 'https://up.example' })).rejects.toMatchObject({ code: 'malformed' })
  })
})

describe('fencegate/verify', () => {
  it('imports nothing from node:, and neither does the signer', () => {
    const dir = join(import.meta.dirname, '../src/verify')
    const files = [...readdirSync(dir).map((f) => join(dir, f)), join(import.meta.dirname, '../src/gateway/attest.ts')]
    for (const file of files) expect(readFileSync(file, 'utf8')).not.toMatch(/from ['"]node:/)
  })

  it('is exported as fencegate/verify from the built package', async () => {
    const script = "const m = await import('fencegate/verify'); console.log(Object.keys(m).sort().join(','))"
    const out = await new Promise<string>((resolve, reject) => execFile(process.execPath, ['--input-type=module', '-e', script], { cwd: join(import.meta.dirname, '..') },
      (err, stdout) => (err ? reject(err) : resolve(stdout.trim()))))
    expect(out.split(',')).toEqual(expect.arrayContaining(['verifyAttestation', 'AttestationError', 'attestationType']))
  })
})
