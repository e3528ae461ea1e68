import cluster, { type Worker } from 'node:cluster'
import { AggregatorRegistry, type RegistryContentType } from 'prom-client'
import type { Logger } from '../../observe/log.js'

/**
 * `server.workers > 1`: the supervising process of a gateway. It opens no store and serves
 * nothing itself; it runs the workers (node:cluster: they share the data and admin ports,
 * the primary hands each new connection to one of them in turn), restarts one that dies,
 * sums their metrics for whichever worker is scraped, and on SIGTERM or SIGINT has all of
 * them drain and stop within the shutdown grace.
 *
 * Why node:cluster and not `reusePort`: cluster runs on every Node line we support (20
 * included), and its round-robin spreads connections evenly; `reusePort` (Node 22.12+,
 * Linux) lets the kernel hash connections to listeners, which skips the primary's hand-off
 * but balances unevenly with few, long-lived connections, which is how SDKs talk to a
 * gateway. With keep-alive the hand-off is paid once per connection.
 */

/** Messages between the supervisor and its workers; `fencegate` tells them from prom-client's. */
export type ClusterMessage =
  | { fencegate: 'ready' }
  | { fencegate: 'workers'; live: number }
  | { fencegate: 'metrics'; id: number; text?: string }

export interface SupervisorOptions {
  count: number
  log: Logger
  /** How long the workers may drain after SIGTERM before they are killed (the gateway's grace, 10 s). */
  graceMs: number
}

/**
 * When a worker that served dies: its failures in a row (reset to 1 once it had run 10 s)
 * and how long to wait before starting it again, 100 ms doubling to at most 5 s.
 *
 * @example
 * restartBackoff(0, 50) // { failures: 1, delayMs: 100 }
 * restartBackoff(3, 50) // { failures: 4, delayMs: 800 }
 */
export function restartBackoff(failures: number, ranMs: number): { failures: number; delayMs: number } {
  const next = ranMs > 10_000 ? 1 : failures + 1
  return { failures: next, delayMs: Math.min(5000, 100 * 2 ** (next - 1)) }
}

/** Answers a worker's scrape with every worker's metrics summed (an empty answer when that fails). */
function answerMetrics(aggregator: AggregatorRegistry<RegistryContentType>, worker: Worker, id: number): void {
  aggregator.clusterMetrics().then(
    (text) => worker.isConnected() && worker.send({ fencegate: 'metrics', id, text } satisfies ClusterMessage),
    () => worker.isConnected() && worker.send({ fencegate: 'metrics', id } satisfies ClusterMessage),
  )
}

/**
 * Runs `count` workers until SIGTERM or SIGINT; resolves to the exit code. A worker that
 * exits before it ever served stops the whole gateway (its configuration or its store is
 * wrong, and restarting would only repeat it); one that dies later is restarted after a
 * backoff (100 ms, doubling to 5 s; reset once it has run 10 s), logged as `worker_exited`.
 *
 * @example
 * if (cluster.isPrimary && workers > 1) process.exitCode = await superviseWorkers({ count: workers, log, graceMs: 10_000 })
 */
export function superviseWorkers(o: SupervisorOptions): Promise<number> {
  const aggregator = new AggregatorRegistry()
  const slots = new Map<number, { worker: Worker; startedAt: number; failures: number; ready: boolean }>()
  let stopping = false
  let exitCode = 0
  let ready = false
  let resolveExit: (code: number) => void = () => {}
  const exited = new Promise<number>((resolve) => (resolveExit = resolve))

  const live = () => [...slots.values()].filter((s) => s.ready && !s.worker.isDead()).length
  const broadcast = () => {
    for (const s of slots.values()) if (s.worker.isConnected()) s.worker.send({ fencegate: 'workers', live: live() } satisfies ClusterMessage)
  }
  const fork = (index: number, failures: number) => {
    const worker = cluster.fork({ FENCEGATE_WORKER_INDEX: String(index), FENCEGATE_WORKERS: String(o.count) })
    slots.set(index, { worker, startedAt: performance.now(), failures, ready: false })
    worker.on('message', (message: ClusterMessage) => onMessage(index, worker, message))
    worker.on('exit', (code, signal) => onExit(index, worker, code, signal))
  }
  const onMessage = (index: number, worker: Worker, message: ClusterMessage) => {
    if (message?.fencegate === 'ready') {
      slots.get(index)!.ready = true
      if (!ready && [...slots.values()].every((s) => s.ready)) {
        ready = true
        o.log.info('workers_ready', { workers: o.count })
      }
      broadcast()
    } else if (message?.fencegate === 'metrics') {
      answerMetrics(aggregator, worker, message.id)
    }
  }
  const onExit = (index: number, worker: Worker, code: number | null, signal: string | null) => {
    const slot = slots.get(index)
    if (slot?.worker !== worker) return
    broadcast()
    if (stopping) {
      if ([...slots.values()].every((s) => s.worker.isDead())) resolveExit(exitCode)
      return
    }
    if (!slot.ready) {
      o.log.error('worker_failed_to_start', { worker: index, code, signal })
      void stop(1)
      return
    }
    const { failures, delayMs } = restartBackoff(slot.failures, performance.now() - slot.startedAt)
    o.log.warn('worker_exited', { worker: index, code, signal, restart_in_ms: delayMs })
    setTimeout(() => !stopping && fork(index, failures), delayMs)
  }
  const stop = async (code: number) => {
    if (stopping) return
    stopping = true
    exitCode = code
    process.off('SIGTERM', onSignal).off('SIGINT', onSignal)
    // Further signals while the workers drain are for them, not for the supervisor.
    process.on('SIGTERM', () => {}).on('SIGINT', () => {})
    for (const s of slots.values()) if (!s.worker.isDead()) s.worker.process.kill('SIGTERM')
    const killer = setTimeout(() => {
      for (const s of slots.values()) if (!s.worker.isDead()) s.worker.process.kill('SIGKILL')
    }, o.graceMs + 2000)
    if ([...slots.values()].every((s) => s.worker.isDead())) resolveExit(code)
    await exited
    clearTimeout(killer)
  }
  const onSignal = () => void stop(0)
  process.on('SIGTERM', onSignal).on('SIGINT', onSignal)
  // Each worker reads its upstream_tls files again on its own SIGHUP.
  process.on('SIGHUP', () => {
    for (const s of slots.values()) if (!s.worker.isDead()) s.worker.process.kill('SIGHUP')
  })
  for (let i = 0; i < o.count; i++) fork(i, 0)
  return exited
}
