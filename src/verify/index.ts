/**
 * The upstream's side of signed fence attestation (`fencegate/verify`):
 * checks a `Fence-Attestation` header against the gateway's public key and,
 * optionally, against the request the upstream actually received.
 * Runtime-neutral: it needs only jose and Web Crypto.
 *
 * @example
 * import { verifyAttestation } from 'fencegate/verify'
 * const claims = await verifyAttestation(req.headers['fence-attestation'], {
 *   key: publicKeyPem, audience: 'https://payments.internal',
 *   request: { method: req.method, path: req.url, body, fence: req.headers['x-execution-fence'] },
 * })
 */
import { errors, importSPKI, jwtVerify, type CryptoKey, type JWK, type JWTPayload, type JWTVerifyGetKey, type KeyObject } from 'jose'

/** The JWS `typ` of an attestation; a token of any other type is refused, even when signed by the same key. */
export const attestationType = 'fence-attestation+jwt'

/** The algorithms a gateway signs attestations with. */
export const attestationAlgorithms = ['ES256', 'EdDSA'] as const

/** What a verified attestation states. */
export interface AttestationClaims {
  iss: string
  /** The upstream origin the gateway forwarded to. */
  aud: string
  iat: number
  exp: number
  tenant: string
  entity: string
  /** The fence that passed the check, canonical decimal. */
  fence: string
  idempotency_key: string | null
  /** Lower-case hex SHA-256 of the body the gateway forwarded. */
  body_sha256: string
  method: string
  /** Path and query the gateway sent to the upstream. */
  path: string
  route: string
  /** The request's `X-Request-Id`: chosen by the client, so not unique; dedup on `jti`. */
  request_id: string
  /** This attestation's own id, chosen by the gateway at random: unique per attestation. */
  jti: string
}

/**
 * The gateway's public key: a PEM `PUBLIC KEY` (SPKI), a CryptoKey or KeyObject,
 * a public JWK, or a key resolver such as jose's `createLocalJWKSet` (which
 * picks the key by the attestation's `kid`, for key rotation).
 */
export type AttestationKey = string | CryptoKey | KeyObject | JWK | JWTVerifyGetKey

/** The request as the upstream received it: each given part must match the attestation. */
export interface ReceivedRequest {
  method: string
  /** Path and query, as received (e.g. Node's `req.url`). */
  path: string
  /** The exact bytes received; a string is taken as its UTF-8 bytes. */
  body: Uint8Array | string
  /** The `X-Execution-Fence` header received; compared as a number, so `007` matches `7`. */
  fence?: string | null
  /** The `Idempotency-Key` header received, or null for none; not compared when undefined. */
  idempotencyKey?: string | null
}

export interface VerifyAttestationOptions {
  key: AttestationKey
  /** This upstream's origin, exactly as the gateway's route names it (`https://payments.internal`). */
  audience: string
  /** The gateway's `attestation.issuer`; default `fencegate`. */
  issuer?: string
  /** Refuse attestations issued longer ago than this (whole seconds, rounded down), even before their `exp`. */
  maxAgeMs?: number
  /** Slack for the two clocks on `exp` and `iat`, in milliseconds (whole seconds, rounded up); default 5000. */
  clockToleranceMs?: number
  /** Also check the attestation against the request that carried it. */
  request?: ReceivedRequest
  /** The verifier's clock; defaults to the current time. */
  now?: Date
  /**
   * The replay check: true when this `jti` was seen before (the attestation is then refused as
   * `replayed`), else records it until `exp` (epoch seconds, plus the clock tolerance) and
   * returns false. Called last, only for an attestation that passed every other check, so
   * forged or mismatched ones never fill what it records.
   */
  seen?: (jti: string, exp: number) => boolean | Promise<boolean>
}

/** Why an attestation was refused. */
export type AttestationErrorCode = 'malformed' | 'bad_signature' | 'unknown_key' | 'expired' | 'not_yet_valid' | 'wrong_issuer' | 'wrong_audience' | 'mismatch' | 'replayed'

/** Which part of the received request differs from the attestation. */
export type MismatchField = 'method' | 'path' | 'body_sha256' | 'fence' | 'idempotency_key'

/**
 * An attestation that does not verify. `code` is stable; `field` names what
 * differs when `code` is `mismatch`.
 *
 * @example
 * try { await verifyAttestation(jws, options) } catch (e) { if (e instanceof AttestationError && e.code === 'expired') ... }
 */
export class AttestationError extends Error {
  override name = 'AttestationError'
  constructor(readonly code: AttestationErrorCode, message: string, readonly field?: MismatchField) {
    super(message)
  }
}

/**
 * Verifies a `Fence-Attestation`: signature (ES256 or EdDSA only), `typ`,
 * `iss`, `aud`, `exp`, and with `request`, that the method, path, body hash,
 * fence and idempotency key match what this upstream received, and with `seen`,
 * that its `jti` was not presented before. Resolves with the claims; throws
 * AttestationError otherwise.
 *
 * @example
 * const ids = new Set<string>() // one process; several upstreams share a table or Redis
 * const claims = await verifyAttestation(jws, { key: pem, audience: 'http://127.0.0.1:9001',
 *   request: { method: 'POST', path: '/payments/42/capture', body: rawBody },
 *   seen: (jti) => ids.has(jti) || (ids.add(jti), false) })
 * console.log(claims.tenant, claims.entity, claims.fence, claims.jti)
 */
export async function verifyAttestation(jws: string | null | undefined, options: VerifyAttestationOptions): Promise<AttestationClaims> {
  if (typeof jws !== 'string' || jws.length === 0) throw new AttestationError('malformed', 'no attestation')
  let payload: JWTPayload
  try {
    ;({ payload } = await jwtVerify(jws, resolverFor(options.key), {
      algorithms: [...attestationAlgorithms],
      typ: attestationType,
      issuer: options.issuer ?? 'fencegate',
      audience: options.audience,
      requiredClaims: ['iat', 'exp'],
      clockTolerance: Math.ceil((options.clockToleranceMs ?? 5000) / 1000),
      ...(options.maxAgeMs !== undefined ? { maxTokenAge: Math.floor(options.maxAgeMs / 1000) } : {}),
      ...(options.now ? { currentDate: options.now } : {}),
    }))
  } catch (err) {
    throw fromJose(err)
  }
  const claims = checkShape(payload)
  if (options.request) await checkRequest(claims, options.request)
  if (options.seen && await options.seen(claims.jti, claims.exp)) throw new AttestationError('replayed', 'this attestation was presented before')
  return claims
}

// A PEM is imported for the algorithm the attestation names (one of the two allowed), once per algorithm.
function resolverFor(key: AttestationKey): Exclude<AttestationKey, string> {
  if (typeof key !== 'string') return key
  const imported = new Map<string, Promise<CryptoKey>>()
  return (header) => {
    const alg = header.alg ?? ''
    let k = imported.get(alg)
    if (!k) imported.set(alg, (k = importSPKI(key, alg)))
    return k
  }
}

function fromJose(err: unknown): AttestationError {
  if (err instanceof errors.JWTExpired) return new AttestationError('expired', 'the attestation has expired')
  if (err instanceof errors.JWTClaimValidationFailed) {
    if (err.claim === 'iss') return new AttestationError('wrong_issuer', 'the attestation has another issuer')
    if (err.claim === 'aud') return new AttestationError('wrong_audience', 'the attestation is for another upstream')
    if (err.claim === 'iat' || err.claim === 'nbf') return new AttestationError('not_yet_valid', 'the attestation is issued in the future')
    return new AttestationError('malformed', `the attestation's ${err.claim} is not accepted`)
  }
  if (err instanceof errors.JWSSignatureVerificationFailed) return new AttestationError('bad_signature', 'the signature does not verify')
  if (err instanceof errors.JOSEAlgNotAllowed) return new AttestationError('bad_signature', 'the algorithm is not accepted')
  if (err instanceof errors.JWKSNoMatchingKey) return new AttestationError('unknown_key', 'no key matches the attestation')
  // Also a key that cannot be imported for the attestation's algorithm: it cannot be this gateway's.
  return new AttestationError('malformed', 'not a valid attestation')
}

const stringClaims = ['tenant', 'entity', 'fence', 'body_sha256', 'method', 'path', 'route', 'request_id', 'jti'] as const

function checkShape(p: JWTPayload): AttestationClaims {
  for (const name of stringClaims) {
    if (typeof p[name] !== 'string') throw new AttestationError('malformed', `the attestation has no ${name}`)
  }
  if (p.idempotency_key !== null && typeof p.idempotency_key !== 'string') throw new AttestationError('malformed', 'the attestation has no idempotency_key')
  if (typeof p.aud !== 'string' || typeof p.iss !== 'string') throw new AttestationError('malformed', 'the attestation has no single aud or iss')
  return p as unknown as AttestationClaims
}

async function checkRequest(claims: AttestationClaims, r: ReceivedRequest): Promise<void> {
  if (r.method.toUpperCase() !== claims.method) throw mismatch('method')
  if (r.path !== claims.path) throw mismatch('path')
  if (await sha256Hex(typeof r.body === 'string' ? new TextEncoder().encode(r.body) : r.body) !== claims.body_sha256) throw mismatch('body_sha256')
  if (r.fence !== undefined && !sameFence(r.fence, claims.fence)) throw mismatch('fence')
  if (r.idempotencyKey !== undefined && r.idempotencyKey !== claims.idempotency_key) throw mismatch('idempotency_key')
}

function mismatch(field: MismatchField): AttestationError {
  return new AttestationError('mismatch', `the request's ${field} differs from the attestation's`, field)
}

// The gateway signs the canonical fence and forwards the header as the client wrote it.
function sameFence(received: string | null, attested: string): boolean {
  const decimal = /^[0-9]{1,19}$/
  return received !== null && decimal.test(received) && decimal.test(attested) && BigInt(received) === BigInt(attested)
}

async function sha256Hex(bytes: Uint8Array): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes as Uint8Array<ArrayBuffer>))
  let hex = ''
  for (const b of digest) hex += b.toString(16).padStart(2, '0')
  return hex
}
