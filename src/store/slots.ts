/**
 * PostgreSQL refused a new connection for want of a slot (`53300`, too_many_connections):
 * its `max_connections` is taken, by other clients or by other gateways. A statement that was
 * waiting for that connection never reached the server, so it can wait instead for one of the
 * connections the pool already has: the next statement to settle leaves its connection idle,
 * and postgres.js hands a new statement an idle connection before it opens another.
 *
 * Waiters are woken one per settled statement, oldest first, so each retry meets the
 * connection that just came free instead of all of them racing to open new ones.
 *
 * @example
 * const slots = createSlotWait()
 * slots.started()
 * try { return await query } finally { slots.settled() }
 * // after a 53300: if (slots.othersRunning()) await slots.nextFree()
 */
export interface SlotWait {
  /** A statement (or transaction) went to the driver. */
  started(): void
  /** It settled, its connection free again: wakes the oldest waiter. */
  settled(): void
  /** Whether any statement is running whose settling will free a connection. */
  othersRunning(): boolean
  /** Resolves when the next running statement settles. */
  nextFree(): Promise<void>
}

/** SQLSTATE 53300: the server has no connection slot left (too_many_connections). */
export const noSlotLeft = '53300'

export function createSlotWait(): SlotWait {
  let running = 0
  const waiting: (() => void)[] = []
  return {
    started: () => void running++,
    settled() {
      running--
      waiting.shift()?.()
    },
    othersRunning: () => running > 0,
    nextFree: () => new Promise<void>((resolve) => waiting.push(resolve)),
  }
}
