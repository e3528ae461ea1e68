import type { Held, Store } from '../store/store.js'

/**
 * How this process's duplicates wait on keys still in flight. All the duplicates of one
 * (tenant, key) share one poll of the store, and a key this process settles itself wakes its
 * duplicates at once, without a store round trip. So one in-flight key costs the store one
 * read per poll however many duplicates wait on it, and the keys polled at once are capped:
 * the store's reads for waiting stay within its budget when a client retries in a storm.
 */
export interface OutcomeWaits {
  /**
   * Resolves true once the key left `in_flight` (a poll saw it, or this process settled it),
   * false when `waitMs` passed first, or at once when `maxKeys` other keys are already polled:
   * the caller then answers as when the wait ran out (409 `request_in_progress`, Retry-After).
   * Rejects with the store's error when a poll failed, as a poll of its own would have.
   */
  wait(tenant: string, key: string, waitMs: number): Promise<boolean>
  /** `store` with `complete`, `release` and `markUnknown` waking this process's waiters of the key they settled. */
  watching(store: Store): Store
  /** The keys polled now and the duplicates waiting on them. */
  waiting(): { keys: number; waiters: number }
}

export interface OutcomeWaitOptions {
  /** Keys polled at once; a duplicate of one more key is not held (see `keysPolledAtOnce`). */
  maxKeys: number
  /** The first poll's delay, doubling up to `maxPollMs`; defaults 20 ms and 250 ms. */
  firstPollMs?: number
  maxPollMs?: number
  /** Resolves after `ms`: the time between polls (defaults to `setTimeout`; a test drives it by hand). */
  delay?: (ms: number) => Promise<void>
}

/**
 * The keys one process polls at once for its duplicates: half its store connections (at least
 * one). A poll holds no connection between reads, so this bounds the read rate (each key at
 * most four reads a second once its poll slowed down) well below what the pool can serve.
 */
export function keysPolledAtOnce(storeConnections: number): number {
  return Math.max(1, Math.floor(storeConnections / 2))
}

interface Waiter {
  resolve(settled: boolean): void
  reject(err: unknown): void
  timer: ReturnType<typeof setTimeout>
}

interface Polled {
  tenant: string
  key: string
  waiters: Set<Waiter>
  interval: number
}

/**
 * One process's waits (see `OutcomeWaits`), polling `store.getKey`. A poll is no request's:
 * it is not a span of any of the waiters' traces.
 *
 * @example
 * const waits = outcomeWaits(store, { maxKeys: keysPolledAtOnce(config.store.max_connections) })
 * const pipeline = createPipeline({ ...deps, store, outcomeWaits: waits })
 */
export function outcomeWaits(store: Pick<Store, 'getKey'>, options: OutcomeWaitOptions): OutcomeWaits {
  const polls = new KeyPolls(store, {
    first: options.firstPollMs ?? 20,
    longest: options.maxPollMs ?? 250,
    delay: options.delay ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))),
  })
  return {
    wait(tenant, key, waitMs) {
      const id = idOf(tenant, key)
      const entry = polls.pollOf(id, tenant, key, options.maxKeys)
      if (!entry) return Promise.resolve(false)
      return new Promise<boolean>((resolve, reject) => {
        const w: Waiter = {
          resolve, reject,
          timer: setTimeout(() => {
            entry.waiters.delete(w)
            if (entry.waiters.size === 0) polls.stop(id, entry)
            resolve(false)
          }, waitMs),
        }
        entry.waiters.add(w)
      })
    },
    watching: (inner) => wakingWaiters(inner, polls),
    waiting: () => polls.waiting(),
  }
}

// Tenants and keys are free text: a JSON pair cannot run one into the other.
const idOf = (tenant: string, key: string) => JSON.stringify([tenant, key])

/** `OutcomeWaits.watching`: a key settled by this process wakes its waiters without a poll. */
function wakingWaiters(inner: Store, polls: KeyPolls): Store {
  // Only a write that took effect settles the key: one that failed left it in flight.
  const waking = <F extends (held: Held, ...rest: never[]) => Promise<boolean>>(write: F): F =>
    (async (held: Held, ...rest: never[]) => {
      const done = await write(held, ...rest)
      if (done) polls.settle(idOf(held.tenant, held.key), { settled: true })
      return done
    }) as F
  return { ...inner, complete: waking(inner.complete), release: waking(inner.release), markUnknown: waking(inner.markUnknown) }
}

/** The keys polled now: one poll of the store per key, its delay doubling, shared by all its waiters. */
class KeyPolls {
  private readonly polled = new Map<string, Polled>()

  constructor(
    private readonly store: Pick<Store, 'getKey'>,
    private readonly timing: { first: number; longest: number; delay: (ms: number) => Promise<void> },
  ) {}

  /** The key's poll, started if it had none; undefined when `maxKeys` other keys are polled already. */
  pollOf(id: string, tenant: string, key: string, maxKeys: number): Polled | undefined {
    let p = this.polled.get(id)
    if (!p) {
      if (this.polled.size >= maxKeys) return undefined
      p = { tenant, key, waiters: new Set(), interval: this.timing.first }
      this.polled.set(id, p)
      this.schedule(id, p)
    }
    return p
  }

  // A stopped poll's pending delay finds it gone and reads nothing.
  stop(id: string, p: Polled): void {
    if (this.polled.get(id) === p) this.polled.delete(id)
  }

  settle(id: string, outcome: { settled: true } | { failed: unknown }): void {
    const p = this.polled.get(id)
    if (!p) return
    this.stop(id, p)
    for (const w of p.waiters) {
      clearTimeout(w.timer)
      if ('failed' in outcome) w.reject(outcome.failed)
      else w.resolve(true)
    }
  }

  waiting(): { keys: number; waiters: number } {
    return { keys: this.polled.size, waiters: [...this.polled.values()].reduce((n, p) => n + p.waiters.size, 0) }
  }

  private schedule(id: string, p: Polled): void {
    const ms = p.interval
    p.interval = Math.min(p.interval * 2, this.timing.longest)
    void this.timing.delay(ms).then(() => (this.polled.get(id) === p ? this.poll(id, p) : undefined))
  }

  private async poll(id: string, p: Polled): Promise<void> {
    let state: string | undefined
    try {
      state = (await this.store.getKey(p.tenant, p.key))?.state
    } catch (err) {
      if (this.polled.get(id) === p) this.settle(id, { failed: err })
      return
    }
    // Settled locally, or every waiter left, while the read was out.
    if (this.polled.get(id) !== p) return
    if (state !== 'in_flight') this.settle(id, { settled: true })
    else this.schedule(id, p)
  }
}
