import cluster from 'node:cluster'
import { openConfigFile, type ConfigSource } from '../config/load.js'
import { ConfigError, type Config } from '../config/schema.js'
import { clusterWorker } from '../runtime/node/cluster-worker.js'
import { databaseUrlFor, startGateway, type RunningGateway } from '../runtime/node/gateway.js'
import { drainDelay } from '../runtime/node/drain.js'
import type { Logger } from '../observe/log.js'
import { superviseWorkers } from '../runtime/node/supervisor.js'
import { loadUpstreamTls } from '../runtime/node/upstream-tls.js'
import { reloadProblems } from '../runtime/node/secrets-reload.js'
import { workerCount, workerPool } from '../runtime/node/workers.js'
import { createPinoLogger } from '../runtime/node/log.js'
import { installProcessPolicy } from '../runtime/node/process-policy.js'
import { nodeTracing } from '../runtime/node/tracing.js'
import { tracingSettings } from '../runtime/node/tracing-env.js'
import { portFlag, stringFlag, UsageError, type Flags } from './usage.js'

/** `fencegate serve`: runs until SIGINT or SIGTERM, then drains and exits. */
export async function runServe(flags: Flags): Promise<number> {
  const source = withFlags(openConfigFile(stringFlag(flags, 'config') ?? 'fencegate.yaml', process.env), flags)
  const config = source.load()
  const databaseUrl = databaseUrlFor(config, stringFlag(flags, 'database-url'), process.env)
  const workers = workerCount(workersFlag(flags) ?? config.server.workers)
  // The OTEL_* variables, read once and before any worker starts (docs/operations.md#traces): a value that cannot be used stops the start.
  const traced = tracingSettings(process.env)
  if (workers > 1 && cluster.isPrimary) return supervise(config, workers, databaseUrl)
  const worker = clusterWorker()
  // The handlers go in before the gateway starts: a SIGTERM sent as soon as it logs
  // `listening` (an orchestrator, a test) must drain it, not kill it, and one sent while it
  // starts stops it as soon as it is up.
  let shutdown: (signal?: NodeJS.Signals) => void = () => {}
  const stopRequested = new Promise<NodeJS.Signals | undefined>((resolve) => {
    shutdown = (signal) => {
      process.off('SIGINT', shutdown)
      process.off('SIGTERM', shutdown)
      // A worker hears the terminal's SIGINT and the supervisor's SIGTERM: the second must not kill its drain.
      if (worker) process.on('SIGINT', () => {}).on('SIGTERM', () => {})
      resolve(signal)
    }
  })
  process.on('SIGINT', shutdown)
  process.on('SIGTERM', shutdown)
  // SIGHUP reads the upstream_tls files and the `${file:…}` secrets again (rotated certificates
  // and credentials); before the gateway is up there is nothing to reload, and the default
  // (ending the process) must not apply either.
  let reload = () => {}
  const onHangup = () => reload()
  process.on('SIGHUP', onHangup)
  // A worker whose supervisor is gone (killed) drains and exits rather than live on as an orphan.
  if (worker) process.on('disconnect', () => shutdown())
  const log = createPinoLogger(config.log.level, undefined, worker ? { worker: worker.index } : undefined)
  installProcessPolicy(log)
  const tracing = nodeTracing(traced, log)
  let gateway: Awaited<ReturnType<typeof startGateway>>
  try {
    gateway = await startGateway({ config, log, databaseUrl, tracing, ...(worker ? { cluster: worker } : {}) })
  } catch (err) {
    shutdown()
    await tracing.shutdown().catch(() => {})
    throw err
  }
  worker?.ready()
  reload = () => {
    gateway.reloadUpstreamTls()
    void reloadSecrets(source, gateway, log)
  }
  const signal = await stopRequested
  process.off('SIGHUP', onHangup)
  await drainThenClose(gateway, signal === 'SIGTERM' ? config.server.drain_delay : 0, log)
  // Everything fencegate opened is closed now. postgres.js 3.4.9 can still open one more
  // socket: a LISTEN connection that was waiting to reconnect when the store closed does so
  // afterwards, and that socket would keep the process alive. The timer is unref'd, so a
  // clean exit is not delayed by it.
  setTimeout(() => process.exit(0), 1000).unref()
  return 0
}

/**
 * SIGHUP's secrets: the configuration loaded again, every `${file:…}` read anew. A file that
 * cannot be read (or a value that no longer validates) changes nothing: the error names the
 * field and the path, never a value, and the secrets in use stay.
 */
async function reloadSecrets(source: ConfigSource, gateway: RunningGateway, log: Logger): Promise<void> {
  let reread: Config
  try {
    reread = source.load()
  } catch (err) {
    log.error('config_reload_failed', { problems: reloadProblems(err) })
    return
  }
  await gateway.reloadSecrets(reread)
}

/**
 * SIGTERM (an orchestrator's stop: Kubernetes, Docker, systemd) fails readiness at once and keeps
 * serving for `server.drain_delay` before the drain; SIGINT (an operator at a terminal) and a
 * lost supervisor drain at once (docs/deployment.md#rolling-update).
 */
async function drainThenClose(gateway: RunningGateway, delayMs: number, log: Logger): Promise<void> {
  gateway.beginDrain()
  log.info('draining', { drain_delay_ms: delayMs })
  if (delayMs > 0) await drainDelay(delayMs)
  await gateway.close()
}

/** The flags that override the file's settings, applied on every load (at start and on SIGHUP). */
function withFlags(source: ConfigSource, flags: Flags): ConfigSource {
  const port = portFlag(flags, 'port')
  const adminPort = portFlag(flags, 'admin-port')
  const dataDir = stringFlag(flags, 'data-dir')
  return {
    load() {
      const config = source.load()
      if (port !== undefined) config.server.port = port
      if (adminPort !== undefined) config.server.admin_port = adminPort
      if (dataDir !== undefined) config.store.data_dir = dataDir
      return config
    },
  }
}

/** `--workers N` or `--workers auto` (overrides server.workers). */
function workersFlag(flags: Flags): number | 'auto' | undefined {
  const v = stringFlag(flags, 'workers')
  if (v === undefined || v === 'auto') return v
  if (!/^[1-9][0-9]{0,2}$/.test(v) || Number(v) > 256) throw new UsageError(`--workers must be a number from 1 to 256 or auto, got ${JSON.stringify(v)}`)
  return Number(v)
}

/**
 * The supervisor of `workers` processes (src/runtime/node/supervisor.ts). The embedded store
 * is one process's: several workers need PostgreSQL. The store budget is checked here, before
 * any worker starts.
 */
async function supervise(config: Config, workers: number, databaseUrl: string | undefined): Promise<number> {
  if (!databaseUrl) throw new ConfigError(['server.workers: the embedded store admits one process; set store.url (or DATABASE_URL) to a PostgreSQL for more than one worker'])
  workerPool(config.store.max_connections, workers)
  // Each worker reads them again; a missing file fails here first, before any worker starts.
  loadUpstreamTls(config.routes)
  const log = createPinoLogger(config.log.level)
  installProcessPolicy(log)
  log.info('supervising', { workers })
  // Each worker keeps serving for drain_delay after SIGTERM, then drains for up to 10 s.
  return superviseWorkers({ count: workers, log, graceMs: config.server.drain_delay + 10_000 })
}
