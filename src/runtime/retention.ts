import type { Config } from '../config/schema.js'
import { noMetrics, type Metrics } from '../observe/metrics.js'
import type { Store } from '../store/store.js'

/** How many rows one purge statement deletes, and how many statements one purge run may take per table. */
export interface PurgeBounds {
  batch: number
  maxBatches: number
}

/** Rows deleted by one purge run, per table. */
export interface Purged {
  idempotency: number
  audit: number
  fence_history: number
}

const defaultBounds: PurgeBounds = { batch: 1000, maxBatches: 10 }

/**
 * One run of the periodic purge, runtime-neutral (the Node gateway runs it
 * every minute, the Workers cron on its schedule): expired idempotency records,
 * then audit rows and fence history past `audit.retention` and
 * `fence_history.retention` on the database clock. Each table is purged in
 * statements of at most `batch` rows, at most `maxBatches` per run, so a first
 * run over a large backlog never holds a long transaction: the next runs
 * finish it. A table without a retention is never purged. Every deletion is
 * counted in the `rowsPurged` metric.
 *
 * @example
 * setInterval(() => purgeOnce(store, config, metrics).catch(warn), 60_000)
 */
export async function purgeOnce(store: Store, config: Retentions, metrics: Metrics = noMetrics, bounds: PurgeBounds = defaultBounds): Promise<Purged> {
  const idempotency = await purgeTable('idempotency', (limit) => store.purgeExpired(limit), metrics, bounds)
  return { ...await purgeRetained(store, config, metrics, bounds), idempotency }
}

/** The retention half of `purgeOnce`: audit rows and fence history only (the Workers cron purges keys on its own). */
export async function purgeRetained(store: Store, config: Retentions, metrics: Metrics = noMetrics, bounds: PurgeBounds = defaultBounds): Promise<Purged> {
  const { audit: { retention: auditMs }, fence_history: { retention: historyMs } } = config
  return {
    idempotency: 0,
    audit: auditMs === undefined ? 0 : await purgeTable('audit', (limit) => store.purgeAudit(auditMs, limit), metrics, bounds),
    fence_history: historyMs === undefined ? 0 : await purgeTable('fence_history', (limit) => store.purgeFenceHistory(historyMs, limit), metrics, bounds),
  }
}

type Retentions = Pick<Config, 'audit' | 'fence_history'>

async function purgeTable(table: keyof Purged, purge: (limit: number) => Promise<number>, metrics: Metrics, bounds: PurgeBounds): Promise<number> {
  let total = 0
  for (let i = 0; i < bounds.maxBatches; i++) {
    const rows = await purge(bounds.batch)
    total += rows
    if (rows > 0) metrics.rowsPurged({ table, rows })
    if (rows < bounds.batch) break
  }
  return total
}
