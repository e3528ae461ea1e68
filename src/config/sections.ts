import { z } from 'zod'
import { duration, integer } from './fields.js'

const jwsAlgorithms = ['ES256', 'ES384', 'ES512', 'RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'EdDSA'] as const

export const authSchema = z.object({
  mode: z.enum(['none', 'jwt']).default('none'),
  issuer: z.string().min(1).optional(),
  audience: z.string().min(1).optional(),
  jwks_url: z.url({ protocol: /^https?$/ }).optional(),
  public_keys: z.array(z.object({ file: z.string().min(1), alg: z.enum(jwsAlgorithms) }).strict()).min(1).optional(),
  hs256_secret: z.string().optional(),
  tenant_claim: z.string().min(1).default('tenant_id'),
  clock_tolerance: duration.pipe(z.number().max(300_000, 'must be at most 5m')).default(5000),
  // The `typ` header a token must carry (RFC 9068 access tokens: at+jwt): an ID token of the
  // same issuer and audience is then refused. Unset: any typ, for providers that set none.
  token_type: z.string().min(1).max(100).optional(),
}).strict().superRefine((a, ctx) => {
  if (a.mode !== 'jwt') return
  const sources = [a.jwks_url, a.public_keys, a.hs256_secret].filter((s) => s !== undefined).length
  if (sources !== 1) ctx.addIssue({ code: 'custom', message: 'jwt needs exactly one of jwks_url, public_keys or hs256_secret' })
  if (!a.issuer) ctx.addIssue({ code: 'custom', path: ['issuer'], message: 'required when mode is jwt' })
  if (!a.audience) ctx.addIssue({ code: 'custom', path: ['audience'], message: 'required when mode is jwt' })
  // HS256 with a short secret can be brute-forced offline from any token.
  if (a.hs256_secret !== undefined && new TextEncoder().encode(a.hs256_secret).byteLength < 32) {
    ctx.addIssue({ code: 'custom', path: ['hs256_secret'], message: 'must be at least 32 bytes' })
  }
})

/** The key that signs Fence-Attestation headers (docs/attestation.md); the file is read by the runtime's entry. */
export const attestationSchema = z.object({
  key_file: z.string().min(1),
  alg: z.enum(['ES256', 'EdDSA']),
  kid: z.string().regex(/^[\x21-\x7E]{1,128}$/, 'expected 1-128 visible ASCII characters'),
  // Short: an attestation is checked on arrival, and a leaked one must not stay usable for long.
  ttl: duration.pipe(z.number().min(1000, 'must be at least 1s').max(600_000, 'must be at most 10m')).default(60_000),
  issuer: z.string().min(1).max(256).default('fencegate'),
}).strict()

export const jobTypeSchema = z.object({
  name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$/, 'expected 1-64 letters, digits, _ . : -'),
  lease: duration.pipe(z.number().min(1000, 'must be at least 1s').max(86_400_000, 'must be at most 24h')),
  max_attempts: integer(1, 1000).default(5),
  backoff: duration.pipe(z.number().max(600_000, 'must be at most 10m')).default(10_000),
  max_runtime: duration.pipe(z.number().min(1000).max(7 * 86_400_000, 'must be at most 7d')).default(1_800_000),
}).strict().superRefine((j, ctx) => {
  if (j.max_runtime < j.lease) ctx.addIssue({ code: 'custom', path: ['max_runtime'], message: 'must be at least the lease' })
})

/** The validated `auth` section. */
export type AuthConfig = z.output<typeof authSchema>
/** The validated `attestation` section. */
export type AttestationConfig = z.output<typeof attestationSchema>
/** One validated job type. */
export type JobType = z.output<typeof jobTypeSchema>
