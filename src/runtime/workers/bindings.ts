import { createAttestationSigner, type AttestationSigner } from '../../gateway/attest.js'
import { loadConfigText } from '../../config/text.js'
import { ConfigError, type AuthConfig, type Config } from '../../config/schema.js'
import type { VerificationKeys } from '../../http/identity.js'

/** The Worker's bindings: vars and secrets are strings; HYPERDRIVE is an optional Hyperdrive binding. */
export interface WorkerEnv {
  /** The configuration, YAML or JSON, with `${VAR}` expanded from the other string bindings. */
  FENCEGATE_CONFIG?: string
  DATABASE_URL?: string
  /** `on` serves the admin plane under /_admin/ (it requires auth.mode: jwt). */
  FENCEGATE_ADMIN?: string
  HYPERDRIVE?: { connectionString: string }
  /** `FENCEGATE_PUBLIC_KEY_<i>`: the PEM of auth.public_keys[i]; `FENCEGATE_ATTESTATION_KEY`: the PEM of attestation.key_file. */
  [binding: string]: unknown
}

/** The part of the Workers ExecutionContext fencegate uses. */
export interface WorkerContext {
  waitUntil(promise: Promise<unknown>): void
}

/** The string bindings (vars and secrets): what `${VAR}` in the configuration expands from. */
export function stringBindings(env: WorkerEnv): Record<string, string> {
  return Object.fromEntries(Object.entries(env).filter((e): e is [string, string] => typeof e[1] === 'string'))
}

/** Hyperdrive first: binding it says how this Worker should reach the database. */
export function databaseUrlOf(env: WorkerEnv, config: Config, vars: Record<string, string | undefined>): string {
  const url = env.HYPERDRIVE?.connectionString || config.store.url || vars.DATABASE_URL
  if (!url) throw new ConfigError(['DATABASE_URL: not set, and store.url is empty (a Worker has no embedded store)'])
  return url
}

/** The `FENCEGATE_CONFIG` binding read as a configuration file is (`loadConfigText`, which imports nothing from `node:*`). */
export function configFromText(text: string, vars: Record<string, string | undefined>, source = 'FENCEGATE_CONFIG'): Config {
  return loadConfigText(text, vars, source)
}

/** Key material from bindings: a Worker has no files, so public_keys[i] is read from FENCEGATE_PUBLIC_KEY_<i>. */
export function workerKeys(auth: AuthConfig, vars: Record<string, string | undefined>): VerificationKeys {
  // Fetched on first use, each request with its own fetch: workerd forbids I/O at start-up and a request
  // awaiting a fetch that another request started.
  if (auth.jwks_url) return { kind: 'jwks', url: auth.jwks_url, fetchAtStart: false, keySet: { sharePending: false } }
  if (auth.public_keys) {
    return {
      kind: 'public',
      keys: auth.public_keys.map((k, i) => {
        const pem = vars[`FENCEGATE_PUBLIC_KEY_${i}`]
        if (!pem) throw new ConfigError([`FENCEGATE_PUBLIC_KEY_${i}: not set (the PEM for auth.public_keys[${i}], ${k.file})`])
        return { pem, alg: k.alg }
      }),
    }
  }
  return { kind: 'hmac', secret: auth.hs256_secret ?? '' }
}

/** The attestation signer from bindings: a Worker has no files, so the private key's PEM is the secret FENCEGATE_ATTESTATION_KEY. */
export async function workerAttestationSigner(config: Config, vars: Record<string, string | undefined>): Promise<AttestationSigner | undefined> {
  if (!config.attestation) return undefined
  const pem = vars.FENCEGATE_ATTESTATION_KEY
  if (!pem) throw new ConfigError([`FENCEGATE_ATTESTATION_KEY: not set (the PEM private key for attestation.key_file, ${config.attestation.key_file})`])
  return createAttestationSigner(config.attestation, pem)
}
