import { ConfigError, type Config } from '../../config/schema.js'
import { createAuthenticator, type Authenticate } from '../../http/identity.js'
import type { Logger } from '../../observe/log.js'
import { credentialsOf } from '../../rules/credentials.js'
import type { FollowedRuleRegistry } from '../../rules/registry.js'
import { verificationKeys } from './key-material.js'

/** The authenticator the planes hold: it calls the current one, which SIGHUP may replace. */
export interface SwitchableAuth {
  authenticate: Authenticate
  replace(next: Authenticate): void
}

/**
 * @example
 * const auth = switchableAuth(await createAuthenticator(config.auth, verificationKeys(config.auth)))
 * createDataPlane({ ...deps, authenticate: auth.authenticate })
 */
export function switchableAuth(initial: Authenticate): SwitchableAuth {
  let current = initial
  return { authenticate: (request) => current(request), replace: (next) => void (current = next) }
}

/** What a re-read configuration's secrets are applied to. */
export interface SecretTargets {
  rules: FollowedRuleRegistry
  auth: SwitchableAuth
  log: Logger
}

/**
 * Applies the secrets of a configuration read again on SIGHUP (`openConfigFile(...).load()`,
 * which reads every `${file:…}` anew) to a running gateway: the routes' `upstream_headers` and
 * the `auth` section, the two a rotated secret lives in while serving. A value that differs
 * anywhere else (`store.url` from a file, say) needs a restart: it is named, never shown, in
 * `config_reload_needs_restart`, and the one in use stays. Logs `secrets_reloaded` with the
 * fields it changed (names only); resolves to the configuration now in use. If the new
 * `auth` cannot be used (a public key file gone), nothing changes and the error names the field.
 *
 * @example
 * inUse = await applySecrets(inUse, source.load(), { rules, auth, log })
 */
export async function applySecrets(current: Config, next: Config, targets: SecretTargets): Promise<Config> {
  const { rules, auth, log } = targets
  const applied: string[] = []
  if (!sameJson(current.auth, next.auth)) {
    try {
      auth.replace(await createAuthenticator(next.auth, verificationKeys(next.auth)))
    } catch (err) {
      log.error('config_reload_failed', { problems: `auth: cannot use the new settings (${(err as { code?: string }).code ?? (err as Error)?.name ?? 'error'})` })
      return current
    }
    applied.push('auth')
  }
  // The same text, so the same routes in the same order: only values read from files differ.
  const kept: Config = { ...current, auth: next.auth, routes: current.routes.map((r, i) => ({ ...r, upstream_headers: next.routes[i]!.upstream_headers })) }
  const credentials = credentialsOf(kept)
  if (!sameJson([...credentialsOf(current)], [...credentials])) {
    rules.useCredentials(credentials)
    applied.push('routes.upstream_headers')
  }
  const restart = changedFields(withoutLive(current), withoutLive(next), '')
  if (restart.length > 0) log.warn('config_reload_needs_restart', { fields: restart.join(',') })
  log.info('secrets_reloaded', { changed: applied.join(',') })
  // What needs a restart stays as it is in use.
  return kept
}

/** The problems of a re-read that failed, for the log: fields and paths, never a value. */
export function reloadProblems(err: unknown): string {
  return err instanceof ConfigError ? err.problems.join('; ') : (err as Error)?.name ?? 'error'
}

function sameJson(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b)
}

/** The configuration without what `applySecrets` applies while serving. */
function withoutLive(config: Config): unknown {
  return { ...config, auth: undefined, routes: config.routes.map((r) => ({ ...r, upstream_headers: undefined })) }
}

/** The paths (`store.url`, `routes[2].timeout_ms`) at which two parsed configurations differ. */
function changedFields(a: unknown, b: unknown, path: string): string[] {
  if (sameJson(a, b)) return []
  const isTree = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null
  if (!isTree(a) || !isTree(b) || Array.isArray(a) !== Array.isArray(b)) return [path || '(root)']
  const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])]
  return keys.flatMap((k) => changedFields(a[k], b[k], Array.isArray(a) ? `${path}[${k}]` : path ? `${path}.${k}` : k))
}
