import { SignJWT } from 'jose'
import { createAuthenticator, type Authenticate } from '../../src/http/identity.js'
import { authSchema } from '../../src/config/schema.js'

export const issuer = 'https://issuer.test'
export const audience = 'fencegate'
export const secret = 'a-test-secret-of-at-least-32-bytes!!'

export const jwtAuth = { mode: 'jwt', issuer, audience, hs256_secret: secret }

/** The HS256 authenticator the tests' gateways use. */
export function hmacAuthenticator(): Promise<Authenticate> {
  return createAuthenticator(authSchema.parse(jwtAuth), { kind: 'hmac', secret })
}

/** Signs an HS256 token; claims override the defaults (tenant acme, sub worker-1, valid 5 minutes). */
export function token(claims: Record<string, unknown> = {}, options: { key?: Uint8Array; exp?: string | number; iss?: string; aud?: string } = {}): Promise<string> {
  return new SignJWT({ tenant_id: 'acme', sub: 'worker-1', ...claims })
    .setProtectedHeader({ alg: 'HS256' })
    .setIssuer(options.iss ?? issuer)
    .setAudience(options.aud ?? audience)
    .setIssuedAt()
    .setExpirationTime(options.exp ?? '5m')
    .sign(options.key ?? new TextEncoder().encode(secret))
}

export const bearer = async (claims: Record<string, unknown> = {}) => ({ authorization: `Bearer ${await token(claims)}` })
