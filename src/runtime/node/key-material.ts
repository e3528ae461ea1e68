import { readFileSync } from 'node:fs'
import { createAttestationSigner, type AttestationSigner } from '../../gateway/attest.js'
import { ConfigError, type AuthConfig, type Config } from '../../config/schema.js'
import { createAuthenticator, type VerificationKeys } from '../../http/identity.js'
import { loadUpstreamTls, type UpstreamTlsMaterial } from './upstream-tls.js'

/** The key material, read before anything is opened. */
export interface KeyMaterial {
  authenticate: Awaited<ReturnType<typeof createAuthenticator>>
  attest: AttestationSigner | undefined
  upstreamTls: UpstreamTlsMaterial
}

export async function readKeyMaterial(config: Config): Promise<KeyMaterial> {
  const authenticate = await createAuthenticator(config.auth, verificationKeys(config.auth))
  const attest = await attestationSigner(config)
  return { authenticate, attest, upstreamTls: loadUpstreamTls(config.routes) }
}

/** Reads the key material named by `auth` (files are read here, so the core stays runtime-neutral). */
export function verificationKeys(auth: AuthConfig): VerificationKeys {
  if (auth.jwks_url) return { kind: 'jwks', url: auth.jwks_url }
  if (auth.public_keys) return { kind: 'public', keys: auth.public_keys.map((k) => ({ pem: readFileSync(k.file, 'utf8'), alg: k.alg })) }
  return { kind: 'hmac', secret: auth.hs256_secret ?? '' }
}

/** The signer of `Fence-Attestation`, from `attestation.key_file`; undefined without an `attestation` section. */
export async function attestationSigner(config: Pick<Config, 'attestation'>): Promise<AttestationSigner | undefined> {
  if (!config.attestation) return undefined
  let pem: string
  try {
    pem = readFileSync(config.attestation.key_file, 'utf8')
  } catch (err) {
    throw new ConfigError([`attestation.key_file: cannot read ${config.attestation.key_file} (${(err as { code?: string }).code ?? 'error'})`])
  }
  return createAttestationSigner(config.attestation, pem)
}
