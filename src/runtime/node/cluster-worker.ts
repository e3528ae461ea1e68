import cluster from 'node:cluster'
import { AggregatorRegistry, type Registry } from 'prom-client'
import type { AckedPosition, DurabilityPeers, DurabilityRefusalCode } from '../../store/durability.js'
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
  /** What the other workers acknowledged and refuse (src/store/durability.ts). */
  peers: DurabilityPeers
  /** How this worker answers the others' question about its last acknowledged write. */
  answerAcknowledged(own: () => AckedPosition | undefined): void
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
  const peers = durabilityPeers()
  process.on('message', (message: ClusterMessage) => {
    if (message?.fencegate === 'workers') live = message.live
    else if (message?.fencegate === 'metrics') pending.get(message.id)?.(message.text)
    else peers.receive(message)
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
    peers: peers.peers,
    answerAcknowledged: (own) => void (peers.own = own),
  }
}

/** The worker's side of the durability questions the supervisor relays between workers. */
function durabilityPeers() {
  let next = 0
  const asked = new Map<number, (positions: (AckedPosition | null)[] | undefined) => void>()
  let onRefusal: (code: DurabilityRefusalCode, detail: string) => void = () => {}
  const inherited = process.env.FENCEGATE_REFUSING
  const state = {
    own: (): AckedPosition | undefined => undefined,
    peers: {
      ...(inherited ? { refusing: JSON.parse(inherited) as { code: DurabilityRefusalCode; detail: string } } : {}),
      acknowledged: () => new Promise<(AckedPosition | undefined)[] | undefined>((resolve) => {
        const id = next++
        asked.set(id, (positions) => resolve(positions?.map((p) => p ?? undefined)))
        process.send!({ fencegate: 'acked?', id } satisfies ClusterMessage)
      }),
      refuse: (code, detail) => void process.send!({ fencegate: 'refuse', code, detail } satisfies ClusterMessage),
      onRefusal: (handler) => void (onRefusal = handler),
    } satisfies DurabilityPeers,
    receive(message: ClusterMessage) {
      if (message?.fencegate === 'acked?' && message.from !== undefined) {
        const position = state.own()
        process.send!({ fencegate: 'acked', id: message.id, from: message.from, ...(position ? { position } : {}) } satisfies ClusterMessage)
      } else if (message?.fencegate === 'acked' && message.from === undefined) {
        asked.get(message.id)?.(message.positions)
        asked.delete(message.id)
      } else if (message?.fencegate === 'refuse') onRefusal(message.code, message.detail)
    },
  }
  return state
}
