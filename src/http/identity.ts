import type { HeaderView } from './exchange.js'
import { createLocalJWKSet, errors, exportJWK, importSPKI, jwtVerify, type CryptoKey, type JWTVerifyGetKey } from 'jose'
import { ConfigError, type AuthConfig } from '../config/schema.js'
import { createRemoteKeySet, KeySetUnavailable, type KeySetOptions } from './jwks.js'
import { FencegateError } from './problems.js'
import { isStorableText } from '../config/templates.js'

/** Who sent a request: the tenant scopes every fence, key and audit row. */
export interface Identity {
  tenant: string
  /** The token's `sub`, when there is a token; written to audit rows. */
  caller: string | null
  /** The token's scopes; null when authentication is off (every scope is held). */
  scopes: ReadonlySet<string> | null
}

/** The operators' scope: every admin endpoint, every tenant, every job API verb. */
export const adminScope = 'fencegate:admin'

/** Establishes the identity of a request, or throws `unauthenticated` / `tenant_missing`. */
export type Authenticate = (request: { headers: HeaderView }) => Promise<Identity>

/** The single tenant of a gateway without authentication. */
export const defaultIdentity: Identity = Object.freeze({ tenant: 'default', caller: null, scopes: null })

/** Without authentication every request belongs to tenant `default`. */
export const noAuthentication: Authenticate = async () => defaultIdentity

/** Verification key material, loaded by the runtime's entry (files are read there, not here). */
export type VerificationKeys =
  /**
   * A JWKS endpoint. `fetchAtStart` (default true) fetches it in `createAuthenticator`, so a wrong or
   * unreachable URL fails at start naming `auth.jwks_url`; the Workers entry fetches on first use instead.
   */
  | { kind: 'jwks'; url: string; fetchAtStart?: boolean; keySet?: KeySetOptions }
  | { kind: 'public'; keys: { pem: string; alg: string }[] }
  | { kind: 'hmac'; secret: string }

const maxTenantLength = 128

/**
 * Verifies `Authorization: Bearer <JWT>` with jose: signature, `exp`, `nbf`,
 * `iss`, `aud`, and only the algorithms the key material allows (never
 * `none`; an HMAC algorithm only with `hs256_secret`, so a public key can never
 * be used as an HMAC secret). The tenant is the `tenant_claim` claim: it comes
 * from the token, never from the request.
 *
 * @example
 * const authenticate = await createAuthenticator(config.auth, { kind: 'hmac', secret: process.env.SECRET! })
 * const { tenant, caller, scopes } = await authenticate(request)
 */
export async function createAuthenticator(auth: AuthConfig, keys: VerificationKeys): Promise<Authenticate> {
  if (auth.mode === 'none') return noAuthentication
  const { key, algorithms } = await verificationKey(keys)
  // A token without exp would be valid forever: require it.
  const options = { issuer: auth.issuer!, audience: auth.audience!, algorithms, clockTolerance: Math.ceil(auth.clock_tolerance / 1000), requiredClaims: ['exp'], ...(auth.token_type ? { typ: auth.token_type } : {}) }
  const verify = async (token: string) => {
    try {
      return await (typeof key === 'function' ? jwtVerify(token, key, options) : jwtVerify(token, key, options))
    } catch (err) {
      if (!(err instanceof errors.JWKSMultipleMatchingKeys)) throw err
      // Several keys fit the token's algorithm (a rotation): the token is valid if one of them verifies it.
      for await (const candidate of err as errors.JWKSMultipleMatchingKeys & AsyncIterable<CryptoKey>) {
        try {
          return await jwtVerify(token, candidate, options)
        } catch (inner) {
          if (!(inner instanceof errors.JWSSignatureVerificationFailed)) throw inner
        }
      }
      throw new errors.JWSSignatureVerificationFailed()
    }
  }
  return async (request) => {
    const token = bearerToken(request.headers.get('authorization'))
    let payload
    try {
      ;({ payload } = await verify(token))
    } catch (err) {
      throw unauthenticated(describeJoseError(err), true)
    }
    const tenant = payload[auth.tenant_claim]
    if (typeof tenant !== 'string' || tenant.length === 0 || tenant.length > maxTenantLength || !isStorableText(tenant)) {
      throw new FencegateError('tenant_missing', `the token has no usable ${auth.tenant_claim} claim (a string of 1-${maxTenantLength} characters)`)
    }
    const scope = payload.scope
    // The subject is written to audit rows as the caller; text the store cannot hold makes the token unusable.
    if (payload.sub !== undefined && (typeof payload.sub !== 'string' || !isStorableText(payload.sub))) {
      throw unauthenticated("the token's sub claim is not accepted", true)
    }
    return {
      tenant,
      caller: typeof payload.sub === 'string' ? truncated(payload.sub, 256) : null,
      scopes: new Set(typeof scope === 'string' ? scope.split(' ').filter(Boolean) : []),
    }
  }
}

/**
 * The first `max` UTF-16 units of `text`, never half of a surrogate pair: a lone surrogate is
 * text the store cannot hold (it would end in the audit row as U+FFFD, or fail a batch's JSON).
 */
function truncated(text: string, max: number): string {
  const cut = text.slice(0, max)
  return cut.isWellFormed() ? cut : cut.slice(0, -1)
}

async function verificationKey(keys: VerificationKeys): Promise<{ key: Uint8Array | JWTVerifyGetKey; algorithms: string[] }> {
  switch (keys.kind) {
    case 'hmac':
      return { key: new TextEncoder().encode(keys.secret), algorithms: ['HS256'] }
    case 'jwks': {
      const set = createRemoteKeySet(new URL(keys.url), keys.keySet)
      if (keys.fetchAtStart !== false) {
        try {
          await set.refresh()
        } catch (err) {
          // Without its keys the gateway would come up healthy and refuse every token.
          throw new ConfigError([`auth.jwks_url: ${(err as Error).message} from ${keys.url}`])
        }
      }
      return { key: set.getKey, algorithms: asymmetric }
    }
    case 'public': {
      // A local key set lets jose try every key of the token's algorithm (key rotation), or the one its kid names.
      const jwks = await Promise.all(keys.keys.map(async (k, i) => ({
        ...(await exportJWK(await importSPKI(k.pem, k.alg, { extractable: true }))), alg: k.alg, kid: `public_keys[${i}]`,
      })))
      const local = createLocalJWKSet({ keys: jwks })
      // Configured keys carry no kid of the issuer's, so a token's kid must not rule them out.
      const byAlg: JWTVerifyGetKey = (header) => local({ ...header, kid: undefined })
      return { key: byAlg, algorithms: [...new Set(keys.keys.map((k) => k.alg))] }
    }
  }
}

const asymmetric = ['ES256', 'ES384', 'ES512', 'RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'EdDSA']

function bearerToken(header: string | null): string {
  if (header === null) throw unauthenticated('an Authorization: Bearer token is required', false)
  const m = /^Bearer +([A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*)$/i.exec(header)
  if (!m || header.length > 8192) throw unauthenticated('the Authorization header must be Bearer followed by a compact JWT', true)
  return m[1]!
}

function unauthenticated(detail: string, presented: boolean): FencegateError {
  const challenge = presented ? 'Bearer realm="fencegate", error="invalid_token"' : 'Bearer realm="fencegate"'
  return new FencegateError('unauthenticated', detail, {}, { 'www-authenticate': challenge })
}

/** A client-safe reason, from jose's stable error codes only. */
function describeJoseError(err: unknown): string {
  if (err instanceof errors.JWTExpired) return 'the token has expired'
  if (err instanceof errors.JWTClaimValidationFailed) return `the token's ${err.claim} claim is not accepted`
  if (err instanceof errors.JOSEAlgNotAllowed) return "the token's algorithm is not accepted"
  if (err instanceof errors.JWSSignatureVerificationFailed) return "the token's signature does not verify"
  if (err instanceof errors.JWKSNoMatchingKey) return 'no key matches the token'
  if (err instanceof KeySetUnavailable) return `no key fetched from auth.jwks_url matches the token, and ${err.message}`
  return 'the token is not a valid JWT'
}

/**
 * Requires every scope a route lists.
 *
 * @example requireScopes(identity, ['payments:write'])
 */
export function requireScopes(identity: Identity, required: readonly string[]): void {
  if (identity.scopes === null) return
  const missing = required.filter((s) => !identity.scopes!.has(s))
  if (missing.length > 0) throw new FencegateError('insufficient_scope', `the token lacks the scope${missing.length > 1 ? 's' : ''} ${missing.join(', ')}`)
}
