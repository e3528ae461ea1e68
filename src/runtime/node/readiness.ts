import type { ReadinessChecks } from '../../admin/probes.js'
import type { RuleSource } from '../../rules/registry.js'
import type { Db } from '../../store/db.js'
import type { Durability } from '../../store/durability.js'
import { appliedMigration, latestMigration } from '../../store/migrate.js'
import { loadMigrations } from '../../store/migrations-fs.js'
import type { Drain } from './drain.js'

/**
 * What `/readyz` checks on Node (src/admin/probes.ts): the drain, the schema against the
 * migrations this build carries (one statement, which is also the store's reachability),
 * the rules in use and the store's durability refusals.
 *
 * @example
 * createAdminApp({ store, readiness: readinessOf({ db, drain, rules, durability }) })
 */
export function readinessOf(o: { db: Db; drain: Drain; rules: RuleSource; durability: Pick<Durability, 'status'> }): ReadinessChecks {
  const latest = latestMigration(loadMigrations())
  return {
    draining: () => o.drain.draining(),
    migrationsAtHead: async () => (await appliedMigration(o.db)) >= latest,
    rulesLoaded: () => o.rules.current().router !== undefined,
    durability: () => o.durability.status(),
  }
}
