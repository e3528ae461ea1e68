import cluster from 'node:cluster'
import { AggregatorRegistry, type Registry } from 'prom-client'
import { timeoutAfterIo } from '../../store/after-io.js'
import type { AckedPosition, DurabilityPeers, DurabilityRefusalCode } from '../../store/durability.js'
import { ackedAnswerMs, type ClusterMessage } from './supervisor.js'

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
  const supervisor = supervisorRequests()
  const peers = durabilityPeers(supervisor.ask)
  process.on('message', (message: ClusterMessage) => {
    if (message?.fencegate === 'workers') live = message.live
    else if (!supervisor.answered(message)) peers.receive(message)
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
    async aggregate() {
      const answer = await supervisor.ask((id) => ({ fencegate: 'metrics', id }), 6000)
      if (answer?.fencegate !== 'metrics' || answer.text === undefined) throw new Error('the supervisor did not sum the workers\' metrics')
      return answer.text
    },
    ready: () => void process.send!({ fencegate: 'ready' } satisfies ClusterMessage),
    peers: peers.peers,
    answerAcknowledged: (own) => void (peers.own = own),
  }
}

type Ask = (message: (id: number) => ClusterMessage, ms: number) => Promise<ClusterMessage | undefined>

/** Requests to the supervisor, each answered by a message with its id, or by undefined after `ms`. */
function supervisorRequests() {
  let next = 0
  const pending = new Map<number, (answer: ClusterMessage | undefined) => void>()
  const ask: Ask = (message, ms) => new Promise((resolve) => {
    const id = next++
    const timer = timeoutAfterIo(() => settle(undefined), ms)
    const settle = (answer: ClusterMessage | undefined) => {
      timer.cancel()
      pending.delete(id)
      resolve(answer)
    }
    pending.set(id, settle)
    process.send!(message(id))
  })
  return {
    ask,
    /** Settles the request `message` answers; false when it answers none (it is not a reply). */
    answered(message: ClusterMessage): boolean {
      const reply = (message?.fencegate === 'metrics' || (message?.fencegate === 'acked' && message.from === undefined)) ? pending.get(message.id) : undefined
      reply?.(message)
      return reply !== undefined
    },
  }
}

const refusalCodes: readonly DurabilityRefusalCode[] = ['store_not_replicated', 'store_identity_changed', 'store_lost_commits']

/** The refusal the supervisor passed at fork (`FENCEGATE_REFUSING`), if it is one. */
function inheritedRefusal(): { code: DurabilityRefusalCode; detail: string } | undefined {
  try {
    const value = JSON.parse(process.env.FENCEGATE_REFUSING || 'null') as { code?: unknown; detail?: unknown } | null
    if (value && refusalCodes.includes(value.code as DurabilityRefusalCode) && typeof value.detail === 'string') return { code: value.code as DurabilityRefusalCode, detail: value.detail }
  } catch {
    // Only the supervisor writes it, always as JSON.
  }
  return undefined
}

/**
 * The worker's side of the durability questions the supervisor relays between workers. A
 * refusal that arrives (or was inherited at fork) before the store's watch exists is kept and
 * handed to it when it registers.
 */
function durabilityPeers(ask: Ask) {
  let received = inheritedRefusal()
  let onRefusal: ((code: DurabilityRefusalCode, detail: string) => void) | undefined
  const state = {
    own: (): AckedPosition | undefined => undefined,
    peers: {
      async acknowledged() {
        // Longer than the supervisor's own wait, so its answer (complete or not) arrives first.
        const answer = await ask((id) => ({ fencegate: 'acked?', id }), 2 * ackedAnswerMs)
        if (answer?.fencegate !== 'acked' || !answer.positions) return undefined
        return answer.positions.map((p) => p ?? undefined)
      },
      refuse: (code, detail) => void process.send!({ fencegate: 'refuse', code, detail } satisfies ClusterMessage),
      onRefusal(handler) {
        onRefusal = handler
        if (received) handler(received.code, received.detail)
      },
    } satisfies DurabilityPeers,
    receive(message: ClusterMessage) {
      if (message?.fencegate === 'acked?' && message.from !== undefined) {
        const position = state.own()
        process.send!({ fencegate: 'acked', id: message.id, from: message.from, ...(position ? { position } : {}) } satisfies ClusterMessage)
      } else if (message?.fencegate === 'refuse') {
        received ??= { code: message.code, detail: message.detail }
        onRefusal?.(message.code, message.detail)
      }
    },
  }
  return state
}
