import cluster from 'node:cluster'
import { AggregatorRegistry, type Registry } from 'prom-client'
import type { ClusterMessage } from './supervisor.js'

/**
 * A worker's side of `server.workers > 1` (src/runtime/node/supervisor.ts): its index (0 runs
 * the purges, so they run once per interval), how many workers are live, and the metrics of
 * all of them, summed by the supervisor, for a scrape that reached this one.
 */
export interface ClusterWorker {
  index: number
  workers: number
  /** Live workers, as the supervisor last said. */
  liveWorkers(): number
  /** Shares this worker's counters and histograms with the supervisor's sum. */
  shareMetrics(registry: Registry): void
  /** Every worker's shared metrics, summed (Prometheus text). */
  aggregate(): Promise<string>
  /** Tells the supervisor this worker serves. */
  ready(): void
}

/**
 * This process's worker role, or undefined when it is not a worker of a supervisor.
 *
 * @example
 * const worker = clusterWorker()
 * if (worker?.index === 0) startPurges()
 */
export function clusterWorker(): ClusterWorker | undefined {
  if (!cluster.isWorker || process.env.FENCEGATE_WORKER_INDEX === undefined) return undefined
  let live = 0
  let next = 0
  const pending = new Map<number, (text: string | undefined) => void>()
  process.on('message', (message: ClusterMessage) => {
    if (message?.fencegate === 'workers') live = message.live
    else if (message?.fencegate === 'metrics') pending.get(message.id)?.(message.text)
  })
  return {
    index: Number(process.env.FENCEGATE_WORKER_INDEX),
    workers: Number(process.env.FENCEGATE_WORKERS),
    liveWorkers: () => live,
    shareMetrics(registry) {
      AggregatorRegistry.setRegistries([registry])
      // Its constructor installs the worker's answer to the supervisor's requests.
      void new AggregatorRegistry()
    },
    aggregate() {
      const id = next++
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => settle(undefined), 6000)
        const settle = (text: string | undefined) => {
          clearTimeout(timer)
          pending.delete(id)
          if (text === undefined) reject(new Error('the supervisor did not sum the workers\' metrics'))
          else resolve(text)
        }
        pending.set(id, settle)
        process.send!({ fencegate: 'metrics', id } satisfies ClusterMessage)
      })
    },
    ready: () => void process.send!({ fencegate: 'ready' } satisfies ClusterMessage),
  }
}
