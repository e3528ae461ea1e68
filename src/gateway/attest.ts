import { importPKCS8, SignJWT, type CryptoKey } from 'jose'
import { ConfigError, type AttestationConfig, type RouteConfig } from '../config/schema.js'
import type { Trace } from './trace.js'
import { FencegateError } from '../http/problems.js'
import { attestationType } from '../verify/index.js'

/** The header an attesting route adds to its upstream request; a client's own is never passed on. */
export const attestationHeader = 'fence-attestation'

/** What one attestation states: a command that passed the fence check, as the upstream receives it. */
export interface AttestationFacts {
  tenant: string
  entity: string
  /** The accepted fence, canonical decimal. */
  fence: string
  /** The request's Idempotency-Key, or null when it had none. */
  idempotencyKey: string | null
  /** SHA-256 (hex) of the request body as forwarded. */
  bodySha256: string
  method: string
  /** Path and query as the upstream receives them (with the upstream's base path). */
  path: string
  route: string
  requestId: string
  /** The upstream's origin, the attestation's `aud`. */
  audience: string
}

/** Signs one attestation, resolving with the compact JWS for the `Fence-Attestation` header. */
export type AttestationSigner = (facts: AttestationFacts) => Promise<string>

export interface SignerOptions {
  /**
   * The signer's clock, in epoch milliseconds; defaults to the process clock.
   * Injected by tests to sign attestations that are already expired.
   */
  now?: () => number
}

/**
 * Builds the signer of `Fence-Attestation` from the `attestation` section and
 * the PEM of its private key (PKCS#8; the runtime's entry reads the file, so
 * this module stays runtime-neutral). A key that is not a PKCS#8 private key
 * for the configured algorithm is a ConfigError.
 *
 * Each attestation gets a `jti` of its own (a random UUID), so an upstream can refuse a
 * replayed header (`verifyAttestation`'s `seen`).
 *
 * `iat` and `exp` come from the signer's own clock, not the database's: unlike
 * a lease, no decision of fencegate's rests on them. They only tell the
 * upstream how fresh the attestation is, and the upstream checks `exp` against
 * its own clock with its own tolerance.
 *
 * @example
 * const sign = await createAttestationSigner(config.attestation!, readFileSync(config.attestation!.key_file, 'utf8'))
 * headers.set('fence-attestation', await sign({ tenant: 'default', entity: 'invoice:42', fence: '7', idempotencyKey: null,
 *   bodySha256: '…', method: 'POST', path: '/payments/42/capture', route: 'capture', requestId: 'r1', audience: 'https://payments.internal' }))
 */
export async function createAttestationSigner(config: AttestationConfig, pem: string, options: SignerOptions = {}): Promise<AttestationSigner> {
  let key: CryptoKey
  try {
    key = await importPKCS8(pem, config.alg)
  } catch {
    // jose's message may quote key bytes; name the file and what was expected instead.
    throw new ConfigError([`attestation.key_file: ${config.key_file} is not a PEM PKCS#8 private key ("BEGIN PRIVATE KEY") for ${config.alg}`])
  }
  const now = options.now ?? Date.now
  const ttlSeconds = Math.ceil(config.ttl / 1000)
  return async (f) => {
    const iat = Math.floor(now() / 1000)
    return new SignJWT({
      tenant: f.tenant,
      entity: f.entity,
      fence: f.fence,
      idempotency_key: f.idempotencyKey,
      body_sha256: f.bodySha256,
      method: f.method,
      path: f.path,
      route: f.route,
      request_id: f.requestId,
    })
      .setProtectedHeader({ alg: config.alg, kid: config.kid, typ: attestationType })
      .setIssuer(config.issuer)
      .setAudience(f.audience)
      .setIssuedAt(iat)
      .setExpirationTime(iat + ttlSeconds)
      // Chosen here, unlike request_id (the client's X-Request-Id): the one id an upstream can dedup replays on.
      .setJti(crypto.randomUUID())
      .sign(key)
  }
}

/**
 * Signs the command the pipeline accepted, as the upstream will receive it:
 * the path with the upstream's base path, the audience its origin.
 *
 * @example
 * headers.set(attestationHeader, await attestCommand(deps.attest, trace, url, route.config))
 */
export async function attestCommand(sign: AttestationSigner | undefined, trace: Trace, url: URL, rc: RouteConfig): Promise<string> {
  // Validation refuses `attest` without a key, and a fenced body is always hashed; fail closed if either slipped through.
  if (!sign || typeof trace.bodySha256 !== 'string' || trace.entity === undefined || trace.fence === undefined || !trace.identity) {
    throw new FencegateError('internal_error', 'the attestation could not be signed')
  }
  return sign({
    tenant: trace.identity.tenant, entity: trace.entity, fence: trace.fence, idempotencyKey: trace.key ?? null,
    bodySha256: trace.bodySha256, method: trace.method, path: rc.upstream.basePath + url.pathname + url.search,
    route: rc.name, requestId: trace.requestId, audience: rc.upstream.origin,
  })
}
