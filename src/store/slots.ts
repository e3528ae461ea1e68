/**
 * PostgreSQL refused a new connection for want of a slot (`53300`, too_many_connections):
 * its `max_connections` is taken, by other clients or by other gateways. A statement that was
 * waiting for that connection never reached the server, so it can wait instead for one of the
 * connections the pool already has: the next statement to settle leaves its connection idle,
 * and postgres.js hands a new statement an idle connection before it opens another.
 *
 * Waiters are woken one per settled statement, oldest first, so each retry meets the
 * connection that just came free instead of all of them racing to open new ones. A wait
 * lasts while statements keep being served: it ends after `timeoutMs` in which none was
 * (the running ones were only waiting for slots too), as an unreachable server's would.
 *
 * @example
 * const slots = createSlotWait()
 * slots.started()
 * try { return await query } finally { slots.settled(true) }
 * // after a 53300: if (slots.othersRunning() && (mayWait ??= slotDeadline(slots, 1000))()) await slots.nextFree()
 */
export interface SlotWait {
  /** A statement (or transaction) went to the driver. */
  started(): void
  /** It settled, having been `served` on a connection or not: wakes the oldest waiter. */
  settled(served: boolean): void
  /** How many statements have been served on a connection so far. */
  served(): number
  /** Whether any statement is running whose settling will free a connection. */
  othersRunning(): boolean
  /** Resolves when the next running statement settles. */
  nextFree(): Promise<void>
}

/** SQLSTATE 53300: the server has no connection slot left (too_many_connections). */
export const noSlotLeft = '53300'

export function createSlotWait(): SlotWait {
  let running = 0
  let served = 0
  const waiting: (() => void)[] = []
  return {
    started: () => void running++,
    settled(wasServed) {
      running--
      if (wasServed) served++
      waiting.shift()?.()
    },
    served: () => served,
    othersRunning: () => running > 0,
    nextFree: () => new Promise<void>((resolve) => waiting.push(resolve)),
  }
}

/**
 * Whether a statement refused a slot may wait once more: yes until `timeoutMs` have passed
 * without any statement served on a connection. Made on a statement's first refusal.
 */
export function slotDeadline(slots: SlotWait, timeoutMs: number): () => boolean {
  let seen = -1
  let until = 0
  return () => {
    const now = performance.now()
    if (slots.served() !== seen) {
      seen = slots.served()
      until = now + timeoutMs
    }
    return now < until
  }
}
