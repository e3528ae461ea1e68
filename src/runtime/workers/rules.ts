import type { Config } from '../../config/schema.js'
import type { Logger } from '../../observe/log.js'
import { credentialsOf } from '../../rules/credentials.js'
import { compileRuleSet, rulesOfConfig, type RuleRegistry, type RuleSet } from '../../rules/registry.js'
import { validateRuleSet, type RawRule } from '../../rules/schema.js'
import { changeRule, readRules, readRulesVersion, seedRules } from '../../rules/store.js'
import { storeCode, StoreError, type Db } from '../../store/db.js'

/** How often an isolate compares its rules' version with the database's, by default (the Node gateway's fallback check). */
export const defaultRulesCheckMs = 1000

export interface WorkerRules {
  /**
   * The rules for one request, on that request's connection: seeded and loaded
   * on the isolate's first request, then re-read whenever a version check finds
   * a newer version. The check runs at most once per `checkEveryMs` per isolate.
   */
  forRequest(db: Db): Promise<{ rules: RuleSet; registry: RuleRegistry }>
}

/**
 * Rules from the database on Workers. The Node gateway follows changes with
 * LISTEN; a Worker holds no connection between requests, so an isolate checks
 * the version instead: a request that starts `checkEveryMs` or more after a
 * change committed is judged by it (or by a newer one). The check is one
 * indexed read, on at most one request per isolate per `checkEveryMs`.
 *
 * @example
 * const rules = createWorkerRules({ config, log, checkEveryMs: 1000 })
 * const { rules: set } = await rules.forRequest(db)
 */
export function createWorkerRules(o: { config: Config; log: Logger; checkEveryMs: number }): WorkerRules {
  const { config, log, checkEveryMs } = o
  const credentials = credentialsOf(config)
  const validate = (rules: RawRule[]) => validateRuleSet(rules, config.auth.mode, config.attestation !== undefined)
  let set: RuleSet | undefined
  let checkedAt = Number.NEGATIVE_INFINITY

  const load = async (db: Db): Promise<RuleSet> => {
    const stored = await readRules(db)
    return compileRuleSet(stored.version, validate(stored.rules), stored.rules, credentials)
  }
  // Concurrent requests of one isolate may each check: a request awaits only its own connection's I/O.
  const refresh = async (db: Db, force: boolean): Promise<RuleSet> => {
    const started = performance.now()
    if (!set) {
      const seeded = await seedRules(db, rulesOfConfig(config), validate)
      if (seeded.length > 0) log.info('rules_seeded', { names: seeded.join(','), count: seeded.length })
      set = await load(db)
      checkedAt = started
      return set
    }
    if (!force && started - checkedAt < checkEveryMs) return set
    const version = await readRulesVersion(db)
    if (version > set.version) {
      try {
        const next = await load(db)
        if (next.version > set.version) {
          set = next
          log.info('rules_loaded', { rule_version: set.version })
        }
      } catch (err) {
        // Not checked: the next request tries again.
        if (err instanceof StoreError) throw err
        // A stored set that does not validate is not used; the one in use stays, as on Node.
        log.error('rules_reload_failed', { rule_version: set.version, store_code: storeCode(err), error: (err as Error)?.name ?? typeof err })
      }
    }
    // Counted from before the read: every change committed before `started` is in `set` now.
    checkedAt = Math.max(checkedAt, started)
    return set
  }

  return {
    async forRequest(db) {
      const rules = await refresh(db, false)
      const registry: RuleRegistry = {
        current: () => set ?? rules,
        validate,
        async change(c) {
          const result = await changeRule(db, { ...c, validate })
          if (result.changed) await refresh(db, true)
          return result
        },
        refresh: async () => void (await refresh(db, true)),
        close: async () => {},
      }
      return { rules, registry }
    },
  }
}
