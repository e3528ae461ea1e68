import { getRequestListener } from '@hono/node-server'
import type { RequestListener, Server } from 'node:http'
import { createAdminApp } from '../../admin/app.js'
import { createDataPlane, type HandleCommand } from '../../gateway/app.js'
import { ConfigError, type Config } from '../../config/schema.js'
import { browserGuard } from '../../http/browser-guard.js'
import { createJobStore, type JobStore } from '../../leases/store.js'
import { createClaimWake } from '../../leases/wake.js'
import { nodeDataPlane } from './data-plane.js'
import type { Lingering } from './linger.js'
import { listen, stop, urlOf } from './server.js'
import { createDrain, type Drain } from './drain.js'
import { readinessOf } from './readiness.js'
import { requireUrlSettings, storeOptions } from './store-options.js'
import { guardTargets } from './target.js'
import type { Logger } from '../../observe/log.js'
import { instrument, readStoreGauges } from '../../observe/metrics.js'
import { noTracing } from '../../observe/tracing.js'
import { createPinoLogger } from './log.js'
import { createPromMetrics, type PromMetrics } from './metrics.js'
import { createUndiciForward, type UndiciForward } from './forward.js'
import { loadUpstreamTls } from './upstream-tls.js'
import { readKeyMaterial, type KeyMaterial } from './key-material.js'
import { applySecrets, switchableAuth, type SwitchableAuth } from './secrets-reload.js'
import type { NodeTracing } from './tracing.js'
import { nodeSha256Hex } from './hash.js'
import { storeCode, type Db } from '../../store/db.js'
import { migrate } from '../../store/migrate.js'
import { loadMigrations } from '../../store/migrations-fs.js'
import { openPglite } from '../../store/pglite.js'
import { connectPostgres, type PostgresOptions } from '../../store/postgres.js'
import { createStore, type Store } from '../../store/store.js'
import { localDurability, watchDurability, type Durability, type DurabilityPeers } from '../../store/durability.js'
import { startRuleRegistry, type FollowedRuleRegistry } from '../../rules/registry.js'
import { purgeOnce } from '../retention.js'
import type { ClusterWorker } from './cluster-worker.js'
import { workerPool } from './workers.js'
import { keysPolledAtOnce, outcomeWaits } from '../../gateway/outcome-waits.js'

// Key material is read in key-material.ts; these were always importable from here.
export { attestationSigner, verificationKeys } from './key-material.js'
// So is listen, now in server.ts with the connection bounds.
export { listen, type ServerLimits } from './server.js'

/** Picks the store: an explicit URL, then `store.url`, then DATABASE_URL; none means embedded PGlite. */
export function databaseUrlFor(config: Config, explicit: string | undefined, env: Record<string, string | undefined>): string | undefined {
  return explicit || config.store.url || env.DATABASE_URL || undefined
}

/** Opens the Db for a URL (PostgreSQL) or a data directory (embedded PGlite) and migrates it. */
export async function openDb(url: string | undefined, dataDir: string, options: PostgresOptions = {}): Promise<Db> {
  const db = url ? connectPostgres(url, options) : await openPglite(dataDir)
  try {
    if (url) await requireUrlSettings(db, url)
    await migrate(db, loadMigrations())
    return db
  } catch (err) {
    await db.close().catch(() => {})
    throw err
  }
}

export interface RunningGateway {
  dataUrl: string
  adminUrl: string
  store: Store
  /**
   * Reads every route's `upstream_tls` files again (rotated certificates; `fencegate serve` calls
   * it on SIGHUP) and uses them for new connections. Files that fail to load change nothing: the
   * old ones stay in use, and the problems are logged as `upstream_tls_reload_failed`.
   */
  reloadUpstreamTls(): boolean
  /** Uses the `${file:…}` secrets of the configuration loaded again on SIGHUP (src/runtime/node/secrets-reload.ts). */
  reloadSecrets(reread: Config): Promise<void>
  /**
   * Starts the drain (src/runtime/node/drain.ts): `/readyz` answers `503 draining` from now on,
   * and every answer closes its connection, while both planes keep serving until `close`.
   */
  beginDrain(): void
  /** Stops accepting, lets in-flight requests finish (up to `graceMs`), then closes pools and the store. */
  close(graceMs?: number): Promise<void>
}

/** What `startGateway` is given. */
interface GatewayOptions {
  config: Config
  databaseUrl?: string
  log?: Logger
  /** How often the rules' version is checked when a notification was missed (default 1 s). */
  rulesCheckEveryMs?: number
  /** This process's role as one of `server.workers` (src/runtime/node/cluster-worker.ts). */
  cluster?: ClusterWorker
  /** Spans per request (`tracingFromEnv`, src/runtime/node/tracing.ts); none by default. The gateway flushes it when it closes. */
  tracing?: NodeTracing
}

/**
 * Starts both planes on Node: the data plane on `server.host:port`, the admin
 * plane on `server.admin_host:admin_port`.
 *
 * @example
 * const gw = await startGateway({ config, databaseUrl: process.env.DATABASE_URL })
 * console.log(gw.dataUrl)
 */
export async function startGateway(options: GatewayOptions): Promise<RunningGateway> {
  const { cluster, config } = options
  const log = options.log ?? createPinoLogger(config.log.level)
  // Key material first: a bad key file must fail before the store (and its lock) is opened.
  const keys = await readKeyMaterial(config)
  const opened = await openStoreAndRules(options, log)
  const upstream = createUndiciForward({ tls: keys.upstreamTls })
  // Job completions of one turn share a statement, as idempotency completions do.
  const jobs = instrument(createJobStore(opened.db, { schedule: setImmediate, durability: opened.durability }), opened.metrics)
  const parts: GatewayParts = { ...opened, config, log, cluster, upstream, jobs, drain: createDrain(), auth: switchableAuth(keys.authenticate) }
  const { data, adminServer } = await listenPlanes(parts, createPlanes(parts, keys, options.tracing))
  const purge = startPurge(parts)
  // The configuration whose secrets are in use, SIGHUP's latest.
  let inUse = config
  const dataUrl = urlOf(data, config.server.host)
  const adminUrl = urlOf(adminServer, config.server.admin_host)
  warnSharedUpstreamKeys(config, log)
  log.info('listening', { data_url: dataUrl, admin_url: adminUrl, store: opened.db.kind, routes: config.routes.length, ...(cluster ? { pid: process.pid } : {}) })
  return {
    dataUrl,
    adminUrl,
    store: opened.store,
    reloadUpstreamTls: () => reloadUpstreamTls(parts),
    async reloadSecrets(reread) {
      inUse = await applySecrets(inUse, reread, parts)
    },
    beginDrain: () => parts.drain.begin(),
    async close(graceMs = 10_000) {
      clearInterval(purge)
      opened.durability.close()
      await Promise.all([stop(data, graceMs), stop(adminServer, graceMs)])
      await closeParts(parts, options.tracing)
    },
  }
}

/** The store and what lives on it: its durability, the metrics that read it, and the rules kept in it. */
interface OpenedStore {
  db: Db
  /** This process's share of `store.max_connections`. */
  max: number
  durability: Durability
  metrics: PromMetrics
  store: Store
  rules: FollowedRuleRegistry
}

/** Everything the planes are built from and `close` takes down. */
interface GatewayParts extends OpenedStore {
  config: Config
  log: Logger
  cluster: ClusterWorker | undefined
  upstream: UndiciForward
  jobs: JobStore
  drain: Drain
  auth: SwitchableAuth
}

async function openStoreAndRules(options: GatewayOptions, log: Logger): Promise<OpenedStore> {
  const { cluster, config } = options
  // The workers share store.max_connections (src/runtime/node/workers.ts).
  const max = cluster ? workerPool(config.store.max_connections, cluster.workers) : config.store.max_connections
  const db = await openDb(options.databaseUrl, config.store.data_dir, await storeOptions(config, options.databaseUrl, max))
  const durability = await storeDurability(db, config, log, cluster?.peers)
  cluster?.answerAcknowledged(() => durability.acknowledged())
  const metrics = createPromMetrics({
    ...(cluster ? { aggregate: () => cluster.aggregate() } : {}),
    durability: () => durability.status().level,
    readGauges: () => readStoreGauges(db),
    ruleVersion: () => rules.current().version,
    onGaugeError: (err) => log.warn('metrics_gauges_failed', { store_code: storeCode(err) }),
  })
  // Completions of one event-loop turn share one statement: fewer commits and socket writes under load.
  cluster?.shareMetrics(metrics.registry)
  const store = instrument(createStore(db, { schedule: setImmediate, durability }), metrics)
  let rules: FollowedRuleRegistry
  try {
    rules = await startRuleRegistry({ db, config, log, ...(options.rulesCheckEveryMs ? { checkEveryMs: options.rulesCheckEveryMs } : {}) })
  } catch (err) {
    await store.close()
    throw err
  }
  return { db, max, durability, metrics, store, rules }
}

/** The data plane and the admin plane, not yet listening. */
function createPlanes(parts: GatewayParts, keys: KeyMaterial, nodeTracing: NodeTracing | undefined) {
  const { config, store, db, metrics, cluster, rules } = parts
  const { authenticate } = parts.auth
  const tracing = nodeTracing?.tracing ?? noTracing
  // Without auth, web pages are kept out of both planes (src/http/browser-guard.ts).
  const open = config.auth.mode === 'none'
  const dataGuard = open ? { browserGuard: browserGuard(config.server.host, config.server.allowed_hosts) } : {}
  const adminGuard = open ? { browserGuard: browserGuard(config.server.admin_host, config.server.allowed_hosts) } : {}
  // Duplicates' polls are budgeted from this process's own pool.
  const waits = outcomeWaits(store, { maxKeys: keysPolledAtOnce(parts.max) })
  // The process's one wake for waiting claims, its counters on /metrics (notification or poll).
  const claimWake = createClaimWake({ listen: parts.jobs.listenForWork, log: parts.log, maxWaitingPerTenant: config.job_waiting_claims })
  metrics.watchClaimWake(() => claimWake.stats())
  const plane = createDataPlane({ config, store, outcomeWaits: waits, forward: parts.upstream.forward, authenticate, jobs: parts.jobs, claimWake, log: parts.log, rules, digest: nodeSha256Hex, metrics, tracing, storeSystem: db.kind === 'postgres' ? 'postgresql' : 'pglite', ...(keys.attest ? { attest: keys.attest } : {}), ...dataGuard })
  const admin = createAdminApp({ store, durability: parts.durability, ...adminGuard, ...(cluster ? { workers: () => cluster.liveWorkers() } : {}), authenticate, rules: { registry: rules, db }, db, metrics, exposition: metrics, tracing, readiness: readinessOf(parts) })
  return { plane, admin }
}

/** Listens with both planes; a plane that cannot listen closes what was opened for it. */
async function listenPlanes(parts: GatewayParts, planes: ReturnType<typeof createPlanes>): Promise<{ data: Server; adminServer: Server }> {
  const { config } = parts
  let data: Server | undefined
  try {
    // Commands are served by Node's own server; the job API by Hono, as the admin plane is.
    const linger = { timeMs: config.server.lingering_time, timeoutMs: config.server.lingering_timeout }
    const { drain } = parts
    data = await listen(drain.closing(dataPlaneListener(planes.plane, parts.log, linger)), config.server.host, config.server.port, config.server)
    const adminServer = await listen(drain.closing(honoListener(planes.admin.fetch)), config.server.admin_host, config.server.admin_port, config.server)
    return { data, adminServer }
  } catch (err) {
    data?.close()
    await parts.upstream.close()
    await parts.rules.close()
    await parts.store.close()
    throw err
  }
}

/**
 * Expired idempotency records are already ignored; this reclaims their space, and applies the retentions.
 * With several workers the first one purges: once per interval for the whole gateway.
 */
function startPurge({ cluster, config, store, jobs, metrics, log }: GatewayParts): NodeJS.Timeout {
  const purge = setInterval(() => {
    if (cluster && cluster.index !== 0) return
    purgeOnce(store, config, metrics).then((purged) => log.debug('purge_ran', { ...purged }), () => log.warn('purge_failed'))
    // Finished jobs past job_retention, 1000 at a time (src/leases/retention.ts).
    jobs.purgeFinished(config.job_retention).then((n) => metrics.jobsPurged(n), () => log.warn('job_purge_failed'))
  }, config.store.purge_interval)
  purge.unref()
  return purge
}

/**
 * Tenants that send equal keys to an upstream that dedupes them with one shared credential
 * would be one operation there (docs/configuration.md, upstream_key).
 */
function warnSharedUpstreamKeys(config: Config, log: Logger): void {
  for (const r of config.routes) {
    if (config.auth.mode === 'jwt' && r.upstream_dedupes_keys && r.idempotency !== 'off' && r.upstream_key === 'as_sent') log.warn('upstream_keys_shared', { route: r.name })
  }
}

/** `RunningGateway.reloadUpstreamTls`: files that fail to load leave the old ones in use. */
function reloadUpstreamTls({ upstream, config, log }: GatewayParts): boolean {
  try {
    upstream.replaceTls(loadUpstreamTls(config.routes))
  } catch (err) {
    log.error('upstream_tls_reload_failed', { problems: err instanceof ConfigError ? err.problems.join('; ') : (err as Error)?.name ?? 'error' })
    return false
  }
  log.info('upstream_tls_reloaded', { routes: config.routes.filter((r) => r.upstream_tls).length })
  return true
}

/**
 * Each part closes even when one before it failed: a store left open keeps the process alive.
 * Tracing last: the spans of the requests that just drained are exported before the process ends.
 */
async function closeParts({ upstream, rules, store, log }: GatewayParts, tracing: NodeTracing | undefined): Promise<void> {
  for (const [part, close] of [['upstream', () => upstream.close()], ['rules', () => rules.close()], ['store', () => store.close()], ['tracing', () => tracing?.shutdown() ?? Promise.resolve()]] as const) {
    await close().catch((err: unknown) => log.warn('close_failed', { part, store_code: storeCode(err) }))
  }
}

/**
 * What the store can lose: watched on PostgreSQL (src/store/durability.ts); the embedded
 * store has no standby, so `store.require_replicated` cannot be met on it.
 */
async function storeDurability(db: Db, config: Config, log: Logger, peers: DurabilityPeers | undefined): Promise<Durability> {
  if (db.kind === 'postgres') return watchDurability(db, { log, requireReplicated: config.store.require_replicated, ...(peers ? { peers } : {}) })
  if (config.store.require_replicated) {
    await db.close()
    throw new ConfigError(['store.require_replicated: the embedded store has no standby; set store.url to a replicated PostgreSQL'])
  }
  log.warn('store_durability_local', { store: db.kind })
  return localDurability
}

/** A Hono app's `fetch`. */
type HonoFetch = (request: Request, env: never) => Response | Promise<Response>

/**
 * The data plane's Node listener: commands and the job API on Node's own server
 * (src/runtime/node/data-plane.ts), behind the raw-target guard.
 *
 * @example
 * const server = await listen(dataPlaneListener(createDataPlane(deps), log), '127.0.0.1', 0, config.server)
 */
export function dataPlaneListener(plane: { handle: HandleCommand }, log: Logger, linger?: Lingering): RequestListener {
  return guardTargets(nodeDataPlane({ handle: plane.handle, log, ...(linger ? { linger } : {}) }))
}

/** A Hono app's fetch as a Node request listener, with the raw-target guard. */
export function honoListener(fetch: HonoFetch): RequestListener {
  return guardTargets(getRequestListener(fetch as never))
}
