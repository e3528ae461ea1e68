import type { Logger } from '../observe/log.js'
import { connectionLost, mayHaveCommitted, StoreError, storeCode } from '../store/db.js'
import { DurabilityRefusal } from '../store/durability.js'
import { noSlotLeft } from '../store/slots.js'
import type { Held, Store } from '../store/store.js'

/**
 * Whether a failed reservation may have left its key reserved: its statement was sent and the
 * connection lost before the answer, or it ran and the store's durability refused it after.
 */
export function mayHaveReserved(err: unknown): boolean {
  return err instanceof StoreError ? mayHaveCommitted(err) : err instanceof DurabilityRefusal && err.ran
}

/** A failure of the connection (never of the statement): no connection, a lost one, or no slot. */
function unreachable(err: StoreError): boolean {
  return connectionLost(err) || err.sqlstate === noSlotLeft
}

/**
 * Keys this process holds for reservations whose answer it never got.
 *
 * A reservation statement sent on a connection that then broke (a failover, a killed primary,
 * a terminated backend), or one that committed and was then refused by the store's
 * durability (src/store/durability.ts), may have left its key `in_flight` under this
 * process's owner token, although nothing was forwarded for it: the go-ahead never arrived.
 * Left alone, every retry with that key waits out `idempotency_wait` and is then refused with
 * `409 request_in_progress` until `idempotency_lock` expires (seen: a client's retries after a
 * kill-and-promote went unanswered for longer than its 5 s timeout). The owner knows better,
 * so it releases the key: once before the failure is answered, then in the background with a
 * growing delay while the store cannot answer, until one release statement runs or the lock
 * would have expired anyway. A release deletes only an `in_flight` record of this owner
 * token, so it never touches another attempt's reservation or a settled one.
 */
export interface AbandonedKeys {
  /** Releases `held` (one attempt now, then retries); resolves after the first attempt. */
  release(held: Held, lockMs: number, requestId: string): Promise<void>
}

export interface AbandonedOptions {
  /** Keys retried at once at most; past it, the lock's expiry frees a key (1000). */
  max?: number
  /** The first retry's delay, doubled up to 2 s (100 ms). */
  firstDelayMs?: number
}

/**
 * @example
 * const abandoned = abandonedKeys(store, log)
 * // the reservation of `held` failed after it was sent:
 * await abandoned.release(held, route.idempotency_lock, requestId)
 */
export function abandonedKeys(store: Store, log: Logger, options: AbandonedOptions = {}): AbandonedKeys {
  const max = options.max ?? 1000
  const firstDelayMs = options.firstDelayMs ?? 100
  let waiting = 0
  const attempt = async (held: Held, requestId: string): Promise<boolean> => {
    try {
      if (await store.release(held)) log.info('abandoned_key_released', { request_id: requestId })
      return true
    } catch (err) {
      log.debug('abandoned_key_release_failed', { request_id: requestId, store_code: storeCode(err) })
      // Only a store that could not be reached is tried again; a statement it refused ran.
      return !(err instanceof StoreError && unreachable(err))
    }
  }
  const retry = async (held: Held, lockMs: number, requestId: string) => {
    const until = performance.now() + lockMs
    waiting++
    try {
      for (let delay = firstDelayMs; performance.now() + delay < until; delay = Math.min(delay * 2, 2000)) {
        await new Promise((resolve) => setTimeout(resolve, delay).unref?.())
        if (await attempt(held, requestId)) return
      }
    } finally {
      waiting--
    }
  }
  return {
    async release(held, lockMs, requestId) {
      if (await attempt(held, requestId)) return
      if (waiting >= max) return
      void retry(held, lockMs, requestId)
    },
  }
}
