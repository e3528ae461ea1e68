import { silentLogger, type Logger } from '../observe/log.js'
import { storeCode } from '../store/db.js'
import { intervalTicker, Waiters, type Ticker, type Waiter } from './wake-waiters.js'

/**
 * The channel the job statements notify when a job becomes claimable (start, restart,
 * a retryable fail back to `queued`, a release); the payload is the job's type and tenant (`wakeKey`).
 *
 * @example
 * await db.listen?.(jobsChannel, (type) => console.log(`a ${type} job may be claimable`))
 */
export const jobsChannel = 'fencegate_jobs'

/**
 * A notification's payload: the job's type and tenant, as the statements send it
 * (`type || ':' || tenant`), so a start wakes the waiting claims of its own tenant only.
 *
 * @example wakeKey('report', 'acme') // 'report:acme'
 */
export function wakeKey(type: string, tenant: string): string {
  return `${type}:${tenant}`
}

/** Subscribes to {@link jobsChannel}: a `Db.listen` bound to that channel. */
export type ListenForWork = (onType: (type: string) => void, onReconnect: () => void) => Promise<() => Promise<void>>

export { intervalTicker, type Ticker, type Waiter, type WakeReason } from './wake-waiters.js'

/** What a running wake has done, for tests and diagnostics. */
export interface WakeStats {
  /** Claims blocked in `next` right now. */
  waiting: number
  /** Claims registered (from before their first attempt until they answer). */
  registered: number
  /** Whether the process's LISTEN has been established (postgres.js re-establishes it after a drop). */
  listening: boolean
  /** Wake-ups of a blocked claim by a notification for one of its types. */
  notified: number
  /** Fallback polls: one per poll group (a tenant's waiters of one set of types) per tick, however many it holds. */
  ticks: number
  /** Poll groups polling now. */
  groups: number
  /** Times the LISTEN was re-established after its connection dropped. */
  reconnects: number
}

export interface ClaimWake {
  /**
   * Registers a waiting claim for these job types, after making sure the process's
   * LISTEN is active (waiting for it at most until `deadline`). Notifications are
   * latched from here on, so one that lands while the claim runs is never lost.
   * Rejects with {@link TooManyWaiting}, at once, when the tenant has `maxWaitingPerTenant`.
   */
  register(types: string[], deadline: number, tenant: string): Promise<Waiter>
  stats(): WakeStats
  /** Unlistens; waiters still registered fall back to the tick. */
  close(): Promise<void>
}

export interface ClaimWakeOptions {
  /** Without it (a runtime with no lasting connection), waiting claims poll on the fallback tick only. */
  listen?: ListenForWork | undefined
  /**
   * How often the waiting claims of one tenant and set of types look again without a
   * notification (one of them, for all: see `PollGroup`): an expired lease and the end of a
   * backoff produce none, and neither does anything while the LISTEN connection is down.
   * Default 1000 ms.
   */
  fallbackMs?: number
  /** Claims one tenant may have waiting in this process at once (`job_waiting_claims`); default 100. */
  maxWaitingPerTenant?: number
  /** The fallback poll's clock; default `setInterval`. */
  ticker?: Ticker
  log?: Logger
}

/** `job_waiting_claims` when not configured. */
export const defaultMaxWaitingPerTenant = 100

/**
 * A waiting claim refused because its tenant has `limit` claims waiting in this process already.
 *
 * @example
 * await wake.register(['report'], deadline, 'acme').catch((err) => err instanceof TooManyWaiting && answer429(err.limit))
 */
export class TooManyWaiting extends Error {
  override name = 'TooManyWaiting'
  constructor(readonly tenant: string, readonly limit: number) {
    super(`the tenant already has ${limit} claims waiting in this process`)
  }
}

/** The default fallback tick: the slowest a waiting claim notices an expired lease. */
export const defaultFallbackMs = 1000

/**
 * One LISTEN per process, fanned out to every waiting claim: a notification wakes the
 * waiters of its type, which then race for the job with ordinary claim statements (so
 * exactly one gets it, and the others wait again). The LISTEN starts with the first
 * waiting claim and stays for the life of the process; if it fails, waiters poll on the
 * fallback tick and the next waiter tries it again (at most once per tick). The fallback
 * poll is shared: one claim per tenant and set of types looks on each tick, for all of them.
 *
 * @example
 * const wake = createClaimWake({ listen: jobs.listenForWork })
 * const waiter = await wake.register(['report'], performance.now() + 10_000, 'acme')
 * try {
 *   while (!(await claim()) && (await waiter.next(deadline, request.signal)) !== 'aborted') {}
 * } finally {
 *   waiter.release()
 * }
 */
export function createClaimWake(options: ClaimWakeOptions = {}): ClaimWake {
  const fallbackMs = options.fallbackMs ?? defaultFallbackMs
  if (!Number.isFinite(fallbackMs) || fallbackMs <= 0) throw new Error(`fallbackMs must be a positive number of milliseconds, got ${fallbackMs}`)
  const maxPerTenant = options.maxWaitingPerTenant ?? defaultMaxWaitingPerTenant
  if (!Number.isInteger(maxPerTenant) || maxPerTenant < 1) throw new Error(`maxWaitingPerTenant must be a positive integer, got ${maxPerTenant}`)
  const log = options.log ?? silentLogger
  const waiters = new Waiters({ fallbackMs, ticker: options.ticker ?? intervalTicker, maxPerTenant })
  const { counts } = waiters
  const listen = new ProcessListen(options, fallbackMs, log, {
    // The payload is `type:tenant` (a type name has no colon): only that tenant's waiters of that type wake.
    onType: (payload: string) => {
      for (const w of waiters.all) if (w.keys.has(payload)) w.wake('notified')
    },
    // Whatever was notified while the connection was down is lost: every waiter looks again.
    onReconnect: () => {
      counts.reconnects++
      for (const w of waiters.all) w.wake('reconnected')
    },
  })

  return {
    async register(types, deadline, tenant) {
      // Counted before anything is awaited, so claims arriving together cannot pass the cap together.
      const waiter = waiters.add(types.map((type) => wakeKey(type, tenant)), tenant)
      if (!waiter) throw new TooManyWaiting(tenant, maxPerTenant)
      // The first claim must not run before LISTEN is active, or a job started in between
      // would wait for the tick; but never wait for the LISTEN past the claim's own deadline.
      let timer: ReturnType<typeof setTimeout> | undefined
      await Promise.race([
        listen.start(),
        new Promise((resolve) => {
          timer = setTimeout(resolve, Math.max(0, deadline - performance.now()))
        }),
      ])
      clearTimeout(timer)
      return waiter
    },
    stats: () => ({ ...counts, registered: waiters.all.size, groups: waiters.groupCount(), listening: listen.active() }),
    close: () => listen.close(),
  }
}

/** The process's one LISTEN: started by the first waiting claim, tried again at most once per tick after it failed. */
class ProcessListen {
  private listening: Promise<boolean> | undefined
  private unlisten: (() => Promise<void>) | undefined
  private retryAt = 0
  private closed = false

  constructor(
    private readonly options: ClaimWakeOptions,
    private readonly fallbackMs: number,
    private readonly log: Logger,
    private readonly on: { onType: (payload: string) => void; onReconnect: () => void },
  ) {}

  /** Resolves true once the LISTEN is active, false when there is none (yet). */
  start(): Promise<boolean> {
    if (!this.options.listen || this.closed) return Promise.resolve(false)
    if (this.listening) return this.listening
    if (performance.now() < this.retryAt) return Promise.resolve(false)
    this.listening = this.options.listen(this.on.onType, this.on.onReconnect).then((u) => {
      // Closed while the LISTEN was on its way: undo it rather than keep it forever.
      if (this.closed) {
        u().catch(() => {})
        return false
      }
      this.unlisten = u
      return true
    }, (err: unknown) => {
      this.log.warn('jobs_listen_failed', { store_code: storeCode(err) })
      this.listening = undefined
      this.retryAt = performance.now() + this.fallbackMs
      return false
    })
    return this.listening
  }

  active(): boolean {
    return this.unlisten !== undefined && !this.closed
  }

  async close(): Promise<void> {
    this.closed = true
    const u = this.unlisten
    this.unlisten = undefined
    await u?.().catch(() => {})
  }
}
