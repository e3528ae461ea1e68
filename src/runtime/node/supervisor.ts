import cluster, { type Worker } from 'node:cluster'
import { AggregatorRegistry, type RegistryContentType } from 'prom-client'
import type { Logger } from '../../observe/log.js'
import { timeoutAfterIo } from '../../store/after-io.js'
import type { AckedPosition, DurabilityRefusalCode } from '../../store/durability.js'

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
  /** A worker asks for the others' last acknowledged writes; the supervisor asks each of them (`from` set). */
  | { fencegate: 'acked?'; id: number; from?: number }
  /** A worker's own answer (`position`), or the supervisor's to the one that asked (`positions`, absent when one did not answer). */
  | { fencegate: 'acked'; id: number; from?: number; position?: AckedPosition; positions?: (AckedPosition | null)[] }
  /** A worker refuses every command (src/store/durability.ts): so do all of them, restarted ones included. */
  | { fencegate: 'refuse'; code: DurabilityRefusalCode; detail: string }

/**
 * How long the supervisor waits for the workers' acknowledged writes before the asker fails
 * closed: a worker's event loop may stall for a while on busy cores during a failover.
 */
export const ackedAnswerMs = 2000

export interface SupervisorOptions {
  count: number
  log: Logger
  /** How long the workers may drain after SIGTERM before they are killed (`server.drain_delay` and the gateway's grace, 10 s). */
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
  const supervisor = new Supervisor(o)
  // The workers get the signal the supervisor got: SIGTERM keeps them serving for server.drain_delay first, SIGINT does not.
  const onSignal = (signal: NodeJS.Signals) => void supervisor.stop(0, signal)
  process.on('SIGTERM', onSignal).on('SIGINT', onSignal)
  // Each worker reads its upstream_tls files again on its own SIGHUP.
  process.on('SIGHUP', () => supervisor.signalAll('SIGHUP'))
  supervisor.onStop = () => {
    process.off('SIGTERM', onSignal).off('SIGINT', onSignal)
    // Further signals while the workers drain are for them, not for the supervisor.
    process.on('SIGTERM', () => {}).on('SIGINT', () => {})
  }
  supervisor.start()
  return supervisor.exited
}

interface Slot {
  worker: Worker
  startedAt: number
  failures: number
  ready: boolean
}

/** The workers' slots, one per index, and what happens when one is ready, asks or exits. */
class Supervisor {
  private readonly aggregator = new AggregatorRegistry()
  private readonly slots = new Map<number, Slot>()
  /** A durability refusal one worker reached: every worker refuses until the gateway is restarted. */
  private refusing: Extract<ClusterMessage, { fencegate: 'refuse' }> | undefined
  private readonly acked = new AckedQueries()
  private stopping = false
  private exitCode = 0
  private allReady = false
  private resolveExit: (code: number) => void = () => {}
  readonly exited = new Promise<number>((resolve) => (this.resolveExit = resolve))
  onStop: () => void = () => {}

  constructor(private readonly o: SupervisorOptions) {}

  start(): void {
    for (let i = 0; i < this.o.count; i++) this.fork(i, 0)
  }

  signalAll(signal: NodeJS.Signals): void {
    for (const s of this.slots.values()) if (!s.worker.isDead()) s.worker.process.kill(signal)
  }

  async stop(code: number, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    if (this.stopping) return
    this.stopping = true
    this.exitCode = code
    this.onStop()
    this.signalAll(signal)
    const killer = setTimeout(() => this.signalAll('SIGKILL'), this.o.graceMs + 2000)
    if (this.allDead()) this.resolveExit(code)
    await this.exited
    clearTimeout(killer)
  }

  private fork(index: number, failures: number): void {
    // Always set, so a value in the supervisor's own environment never reaches a worker.
    const refusing = this.refusing ? JSON.stringify({ code: this.refusing.code, detail: this.refusing.detail }) : ''
    const worker = cluster.fork({ FENCEGATE_WORKER_INDEX: String(index), FENCEGATE_WORKERS: String(this.o.count), FENCEGATE_REFUSING: refusing })
    this.slots.set(index, { worker, startedAt: performance.now(), failures, ready: false })
    worker.on('message', (message: ClusterMessage) => this.onMessage(index, worker, message))
    worker.on('exit', (code, signal) => this.onExit(index, worker, code, signal))
  }

  private live(): number {
    return [...this.slots.values()].filter((s) => s.ready && !s.worker.isDead()).length
  }

  private allDead(): boolean {
    return [...this.slots.values()].every((s) => s.worker.isDead())
  }

  private broadcast(): void {
    const live = this.live()
    for (const s of this.slots.values()) if (s.worker.isConnected()) s.worker.send({ fencegate: 'workers', live } satisfies ClusterMessage)
  }

  private onMessage(index: number, worker: Worker, message: ClusterMessage): void {
    if (message?.fencegate === 'ready') {
      this.slots.get(index)!.ready = true
      if (!this.allReady && [...this.slots.values()].every((s) => s.ready)) {
        this.allReady = true
        this.o.log.info('workers_ready', { workers: this.o.count })
      }
      this.broadcast()
    } else if (message?.fencegate === 'metrics') {
      answerMetrics(this.aggregator, worker, message.id)
    } else if (message?.fencegate === 'acked?') {
      const others = [...this.slots.values()].filter((s) => s.worker !== worker && s.ready && s.worker.isConnected()).map((s) => s.worker)
      this.acked.ask(worker, message.id, others)
    } else if (message?.fencegate === 'acked' && message.from !== undefined) {
      this.acked.answer(message.from, message.id, worker.id, message.position)
    } else if (message?.fencegate === 'refuse') {
      this.refusing ??= message
      for (const [i, s] of this.slots) if (i !== index && s.worker.isConnected()) s.worker.send(message satisfies ClusterMessage)
    }
  }

  private onExit(index: number, worker: Worker, code: number | null, signal: string | null): void {
    const slot = this.slots.get(index)
    if (slot?.worker !== worker) return
    // It can no longer say what it acknowledged: the questions waiting for it fail closed now.
    this.acked.gone(worker.id)
    this.broadcast()
    if (this.stopping) {
      if (this.allDead()) this.resolveExit(this.exitCode)
      return
    }
    if (!slot.ready) {
      this.o.log.error('worker_failed_to_start', { worker: index, code, signal })
      void this.stop(1)
      return
    }
    const { failures, delayMs } = restartBackoff(slot.failures, performance.now() - slot.startedAt)
    this.o.log.warn('worker_exited', { worker: index, code, signal, restart_in_ms: delayMs })
    setTimeout(() => !this.stopping && this.fork(index, failures), delayMs)
  }
}

interface AckedQuery {
  asker: Worker
  id: number
  /** The cluster ids of the workers yet to answer. */
  waiting: Set<number>
  positions: (AckedPosition | null)[]
  timer: { cancel(): void }
}

/**
 * A worker's question "what did the others acknowledge?": asked of every other live worker,
 * answered once all have said, or without positions (the asker then fails closed) after
 * `ackedAnswerMs` or as soon as one of them exits. Keyed by the asker's cluster id, which no
 * restarted worker reuses.
 */
class AckedQueries {
  private readonly open = new Map<string, AckedQuery>()

  ask(asker: Worker, id: number, others: Worker[]): void {
    const key = `${asker.id}:${id}`
    const query: AckedQuery = { asker, id, waiting: new Set(others.map((o) => o.id)), positions: [], timer: timeoutAfterIo(() => this.settle(key, query, false), ackedAnswerMs) }
    this.open.set(key, query)
    for (const o of others) o.send({ fencegate: 'acked?', id, from: asker.id } satisfies ClusterMessage)
    if (others.length === 0) this.settle(key, query, true)
  }

  answer(askerId: number, id: number, by: number, position: AckedPosition | undefined): void {
    const key = `${askerId}:${id}`
    const query = this.open.get(key)
    if (!query?.waiting.delete(by)) return
    query.positions.push(position ?? null)
    if (query.waiting.size === 0) this.settle(key, query, true)
  }

  /** A worker exited: what it was asked goes unanswered, and what it asked is dropped. */
  gone(workerId: number): void {
    for (const [key, query] of this.open) {
      if (query.asker.id === workerId) this.drop(key, query)
      else if (query.waiting.has(workerId)) this.settle(key, query, false)
    }
  }

  private settle(key: string, query: AckedQuery, answered: boolean): void {
    if (this.open.get(key) !== query) return
    this.drop(key, query)
    const reply: ClusterMessage = { fencegate: 'acked', id: query.id, ...(answered ? { positions: query.positions } : {}) }
    if (query.asker.isConnected()) query.asker.send(reply)
  }

  private drop(key: string, query: AckedQuery): void {
    this.open.delete(key)
    query.timer.cancel()
  }
}
