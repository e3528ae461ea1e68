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
  const first = options.firstPollMs ?? 20
  const longest = options.maxPollMs ?? 250
  const delay = options.delay ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)))
  const polled = new Map<string, Polled>()
  // Tenants and keys are free text: a JSON pair cannot run one into the other.
  const idOf = (tenant: string, key: string) => JSON.stringify([tenant, key])

  // A stopped poll's pending delay finds it gone and reads nothing.
  const stop = (id: string, p: Polled) => {
    if (polled.get(id) === p) polled.delete(id)
  }
  const settle = (id: string, outcome: { settled: true } | { failed: unknown }) => {
    const p = polled.get(id)
    if (!p) return
    stop(id, p)
    for (const w of p.waiters) {
      clearTimeout(w.timer)
      if ('failed' in outcome) w.reject(outcome.failed)
      else w.resolve(true)
    }
  }
  const schedule = (id: string, p: Polled) => {
    const ms = p.interval
    p.interval = Math.min(p.interval * 2, longest)
    void delay(ms).then(() => (polled.get(id) === p ? poll(id, p) : undefined))
  }
  const poll = async (id: string, p: Polled) => {
    let state: string | undefined
    try {
      state = (await store.getKey(p.tenant, p.key))?.state
    } catch (err) {
      if (polled.get(id) === p) settle(id, { failed: err })
      return
    }
    // Settled locally, or every waiter left, while the read was out.
    if (polled.get(id) !== p) return
    if (state !== 'in_flight') settle(id, { settled: true })
    else schedule(id, p)
  }

  return {
    wait(tenant, key, waitMs) {
      const id = idOf(tenant, key)
      let p = polled.get(id)
      if (!p) {
        if (polled.size >= options.maxKeys) return Promise.resolve(false)
        p = { tenant, key, waiters: new Set(), interval: first }
        polled.set(id, p)
        schedule(id, p)
      }
      const entry = p
      return new Promise<boolean>((resolve, reject) => {
        const w: Waiter = {
          resolve, reject,
          timer: setTimeout(() => {
            entry.waiters.delete(w)
            if (entry.waiters.size === 0) stop(id, entry)
            resolve(false)
          }, waitMs),
        }
        entry.waiters.add(w)
      })
    },
    watching(inner) {
      // Only a write that took effect settles the key: one that failed left it in flight.
      const waking = <F extends (held: Held, ...rest: never[]) => Promise<boolean>>(write: F): F =>
        (async (held: Held, ...rest: never[]) => {
          const done = await write(held, ...rest)
          if (done) settle(idOf(held.tenant, held.key), { settled: true })
          return done
        }) as F
      return { ...inner, complete: waking(inner.complete), release: waking(inner.release), markUnknown: waking(inner.markUnknown) }
    },
    waiting: () => ({ keys: polled.size, waiters: [...polled.values()].reduce((n, p) => n + p.waiters.size, 0) }),
  }
}
