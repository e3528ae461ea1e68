import type { Config, EntityRuleConfig } from '../config/schema.js'
import type { Logger } from '../observe/log.js'
import { createRouter, type Router } from '../gateway/route.js'
import type { Db } from '../store/db.js'
import { storeCode } from '../store/db.js'
import { compileEntityRules, type CompiledEntityRule } from './entities.js'
import { credentialsOf, withFileCredentials, type UpstreamCredentials } from './credentials.js'
import { entityRuleToRule, normalizeRule, routeToRule, validateRuleSet, type RawRule, type ValidRules } from './schema.js'
import { canonical, changeRule, readRules, readRulesVersion, rulesChannel, seedRules, type RuleChangeRequest, type RuleChangeResult } from './store.js'

/** Every rule of one version, compiled: what one request is judged by from start to end. */
export interface RuleSet {
  version: number
  router: Router
  entityRules: CompiledEntityRule[]
  /** The rules as stored (routes without their upstream credentials). */
  raw: RawRule[]
}

/** Where the pipeline gets its rules: one consistent set per request. */
export interface RuleSource {
  current(): RuleSet
}

/**
 * Compiles validated rules. A route's `upstream_headers`, `upstream_tls` and
 * `forward_authorization` come from the configuration file by route name, never from the
 * stored rule, and only while the rule's requests stay inside the file entry's: its origin,
 * its method and its upstream path (src/rules/credentials.ts). A stored rule that moves the
 * route elsewhere (through the rules API or straight into `fg_rule_versions`) carries none,
 * so the file's credential, and the callers' own tokens, go only where the file sends them.
 */
export function compileRuleSet(version: number, valid: ValidRules, raw: RawRule[], credentials: ReadonlyMap<string, UpstreamCredentials>): RuleSet {
  const routes = valid.routes.map((r) => withFileCredentials(r, credentials.get(r.name)))
  return { version, router: createRouter(routes), entityRules: compileEntityRules(valid.entityRules), raw }
}

/** The file's rules as seeds: canonical raw form, credentials left in the file. */
export function rulesOfConfig(config: Pick<Config, 'routes' | 'entity_rules'>): RawRule[] {
  return [...config.routes.map(routeToRule), ...config.entity_rules.map((r: EntityRuleConfig) => entityRuleToRule(r))]
}

/**
 * Rules straight from the configuration file, version 0: for runtimes that do
 * not keep rules in the database (embedding, the Workers entry) and for tests.
 *
 * @example
 * createApp({ config, store, forward, rules: staticRules(config) })
 */
export function staticRules(config: Config): RuleSource {
  const set = compileRuleSet(0, { routes: config.routes, entityRules: config.entity_rules }, rulesOfConfig(config), credentialsOf(config))
  return { current: () => set }
}

/** A change made through the admin plane; `validate` is the registry's own. */
export type RuleEdit = Omit<RuleChangeRequest, 'validate'>

/** Rules kept in the database: seeded from the file, changed at runtime, followed by every instance. */
export interface RuleRegistry extends RuleSource {
  /** Validates and stores one change, then uses it at once on this instance. */
  change(c: RuleEdit): Promise<RuleChangeResult>
  /** Validates a candidate rule set as a change would (for dry runs). */
  validate(rules: RawRule[]): ValidRules
  /** Re-reads the rules when the database has a newer version than the one in use. */
  refresh(): Promise<void>
  close(): Promise<void>
}

/** The registry a process keeps: it follows the database, and takes the file's credentials again on SIGHUP. */
export interface FollowedRuleRegistry extends RuleRegistry {
  /**
   * Uses `credentials` (the file's upstream headers, read again with their `${file:…}`
   * secrets) from now on, for the rule set in use and every one loaded after it.
   *
   * @example
   * registry.useCredentials(credentialsOf(reread))
   */
  useCredentials(credentials: ReadonlyMap<string, UpstreamCredentials>): void
}

export interface RegistryOptions {
  db: Db
  config: Config
  log: Logger
  /** How often to compare versions when a notification may have been missed; default 1 s. */
  checkEveryMs?: number
}

/**
 * Seeds the file's rules, loads the current set and follows changes: a NOTIFY
 * on `fencegate_rules` triggers a reload at once, and a periodic version check
 * catches anything a dropped listen connection missed. A set that fails to
 * load or validate is logged and the one in use stays: a gateway never runs
 * half a rule change.
 *
 * @example
 * const rules = await startRuleRegistry({ db, config, log })
 * const app = createApp({ config, store, forward, rules })
 */
export async function startRuleRegistry(o: RegistryOptions): Promise<FollowedRuleRegistry> {
  const { db, config, log } = o
  let credentials: ReadonlyMap<string, UpstreamCredentials> = credentialsOf(config)
  const validate = (rules: RawRule[]) => validateRuleSet(rules, config.auth.mode, config.attestation !== undefined)
  const seeded = await seedRules(db, rulesOfConfig(config), validate)
  if (seeded.length > 0) log.info('rules_seeded', { names: seeded.join(','), count: seeded.length })
  const load = async (): Promise<RuleSet> => {
    const stored = await readRules(db)
    return compileRuleSet(stored.version, validate(stored.rules), stored.rules, credentials)
  }
  const rules = new RuleReloads(await load(), load, log)
  warnAboutDrift(rules.set, config, log)
  const stopFollowing = await followRuleChanges(db, rules, log, o.checkEveryMs ?? 1000)
  return {
    current: () => rules.set,
    validate,
    async change(c) {
      const result = await changeRule(db, { ...c, validate })
      if (result.changed) await rules.reload('change')
      return result
    },
    refresh: () => rules.reload('refresh'),
    useCredentials(next) {
      credentials = next
      rules.set = compileRuleSet(rules.set.version, validate(rules.set.raw), rules.set.raw, credentials)
    },
    close: stopFollowing,
  }
}

/**
 * What made a rule set load, as its `rules_loaded` line says: a change on this instance, a
 * NOTIFY, a re-listen after the LISTEN connection dropped, the periodic version check (what
 * a gateway without a working LISTEN relies on, docs/deployment.md#pgbouncer), or `refresh`.
 */
export type ReloadCause = 'change' | 'notification' | 'reconnect' | 'version_check' | 'refresh'

/** The rule set in use and its reloads: one at a time; a request for another while one runs re-reads once more afterwards. */
class RuleReloads {
  private running: Promise<void> | undefined
  private again = false
  /** The cause of the latest request, which the load that serves it reports. */
  private cause: ReloadCause = 'refresh'

  constructor(public set: RuleSet, private readonly load: () => Promise<RuleSet>, private readonly log: Logger) {}

  reload(cause: ReloadCause): Promise<void> {
    this.cause = cause
    if (this.running) {
      this.again = true
      return this.running
    }
    this.running = (async () => {
      do {
        this.again = false
        try {
          const next = await this.load()
          if (next.version > this.set.version) {
            this.set = next
            this.log.info('rules_loaded', { rule_version: this.set.version, via: this.cause })
          }
        } catch (err) {
          this.log.error('rules_reload_failed', { rule_version: this.set.version, store_code: storeCode(err), error: (err as Error)?.name ?? typeof err })
        }
      } while (this.again)
    })().finally(() => (this.running = undefined))
    return this.running
  }
}

/**
 * Reloads on a NOTIFY, and on a version check every `checkEveryMs` for what a dropped listen
 * connection missed. Resolves to what stops following (the registry's `close`).
 */
async function followRuleChanges(db: Db, rules: RuleReloads, log: Logger, checkEveryMs: number): Promise<() => Promise<void>> {
  // A reconnected listener may have missed notifications: re-read once.
  const unlisten = db.listen
    ? await db.listen(rulesChannel, (payload) => {
      if (Number(payload) > rules.set.version) void rules.reload('notification')
    }, () => void rules.reload('reconnect')).catch((err: unknown) => {
      log.warn('rules_listen_failed', { store_code: storeCode(err) })
      return undefined
    })
    : undefined
  const timer = setInterval(() => {
    readRulesVersion(db).then((v) => (v > rules.set.version ? rules.reload('version_check') : undefined)).catch(() => {})
  }, checkEveryMs)
  ;(timer as { unref?: () => void }).unref?.()
  return async () => {
    clearInterval(timer)
    // The store closes next anyway; an UNLISTEN cut off with its connection changes nothing.
    await unlisten?.().catch((err: unknown) => log.warn('rules_unlisten_failed', { store_code: storeCode(err) }))
  }
}

/** The database wins over the file; say so when they differ, by name only. */
function warnAboutDrift(set: RuleSet, config: Config, log: Logger): void {
  const stored = new Map(set.raw.map((r) => [r.name, canonical(normalizeRule(r))]))
  for (const rule of rulesOfConfig(config)) {
    const current = stored.get(rule.name)
    if (current !== canonical(rule)) log.warn('rule_differs_from_file', { rule: rule.name, rule_version: set.version, in_database: current !== undefined })
  }
}
