import { timeoutAfterIo } from './after-io.js'
import { StoreError } from './db.js'

/**
 * A pool held to the connections it has while the server gives it no new one.
 *
 * postgres.js opens a connection for a statement whenever none is idle and its pool is below
 * `max`, and hands queued statements to connections still opening. When an open fails
 * (PostgreSQL's `max_connections` is taken: `53300`; or a loaded server does not bring the
 * connection up within the connect timeout), its statements fail though they never reached
 * the server, while the pool's live connections go idle; every retry opens (and the server
 * forks) another connection.
 *
 * So the first such refusal, while the pool has live connections (ones that served a
 * statement within the last two `liveMs`, the pool's idle timeout), *holds* the pool: its
 * socket factory opens no connection (`mayOpen`), so that whatever postgres.js would put on a
 * new one fails at once, without touching the network, and waits here (`turn`). Each
 * statement served on a live connection leaves that connection idle and lets the oldest
 * waiter take it. After `probeMs` one connection may open (a probe); when `probeMs` has
 * passed again without a refusal, the hold ends. Waiters fail with the refusal when
 * `probeMs` passes with no statement served (the live connections are stuck or gone); a
 * refusal with no live connection is not held.
 *
 * @example
 * const slots = createSlotGate(1000, 60_000)
 * // postgres.js's socket option: slots.mayOpen() ? connect(port, host) : heldSocket()
 * // a statement handed to postgres.js: slots.entered(); settled: slots.left(query, served)
 * // failed before it was sent: if (slots.held(err) || (refusedConnection(err) && slots.refused(err))) { await slots.turn(); retry }
 */
export interface SlotGate {
  /** Whether a new connection may be opened now: always, but while the pool is held once per `probeMs`. */
  mayOpen(): boolean
  /** A statement (or a transaction) is handed to postgres.js; each is followed by one `left`. */
  entered(): void
  /**
   * A statement (or a transaction: no `query`) settled, `served` by a live connection or not
   * (a lost connection serves nothing); `query` carries postgres.js's stamp of that connection.
   */
  left(query: object | undefined, served: boolean): void
  /** A new connection was refused: holds the pool and answers true when it has live connections to wait for. */
  refused(err: StoreError): boolean
  /** Whether `err` is a connection that the held pool did not open. */
  held(err: StoreError): boolean
  /**
   * Resolves when a live connection next comes free; rejects with the refusal when none does
   * within `probeMs`. A statement that waited before and lost the connection it was woken for
   * waits `again`, first in line. A first wait with no statement in flight resolves at once:
   * nothing would wake it, and the live connections are idle (a statement whose new connection
   * timed out after theirs had ended).
   */
  turn(again?: boolean): Promise<void>
  /** Whether the pool is held. */
  holding(): boolean
}

/** SQLSTATE 53300: the server has no connection slot left (too_many_connections). */
export const noSlotLeft = '53300'

/** The driver code of a connection that a held pool did not open. */
export const heldCode = 'FENCEGATE_POOL_HELD'

/** Whether a failure before sending was a refused new connection: no slot left, or not up within the connect timeout. */
export function refusedConnection(err: StoreError): boolean {
  return err.sqlstate === noSlotLeft || err.driverCode === 'CONNECT_TIMEOUT'
}

/** A gate for a pool whose connect timeout is `probeMs` and whose idle connections close after `liveMs`. */
export function createSlotGate(probeMs: number, liveMs: number): SlotGate {
  const backends = createRecentBackends(liveMs)
  const waiting: { resolve: () => void; reject: (err: StoreError) => void }[] = []
  let holding = false
  let probeAt = 0
  let probed = false
  let refusedSinceProbe = false
  let refusal = new StoreError(noSlotLeft, undefined)
  let running = 0
  // A process that was not scheduled for `probeMs` (a throttled container, a loaded host) runs
  // its due timers before it reads the sockets that answered meanwhile: the waiters fail only
  // if nothing was served once those are read (`timeoutAfterIo`; each statement served re-arms).
  let stall: { cancel(): void } | undefined
  const armStall = () => {
    stall?.cancel()
    stall = waiting.length > 0 ? timeoutAfterIo(failWaiting, probeMs) : undefined
  }
  const failWaiting = () => {
    stall = undefined
    for (const w of waiting.splice(0)) w.reject(refusal)
  }

  return {
    mayOpen() {
      if (!holding) return true
      const now = performance.now()
      if (now < probeAt) return false
      // The last probe's connection was not refused: the server has slots again.
      if (probed && !refusedSinceProbe) holding = false
      else {
        probed = true
        refusedSinceProbe = false
        probeAt = now + probeMs
      }
      return true
    },
    entered() {
      running++
    },
    left(query, served) {
      running--
      if (!served) return
      if (query) backends.served((query as { state?: unknown }).state)
      if (waiting.length > 0) waiting.shift()!.resolve()
      if (stall !== undefined) armStall()
    },
    refused(err) {
      if (backends.live() === 0) return false
      refusal = err
      if (!holding) probed = false
      holding = true
      refusedSinceProbe = true
      probeAt = performance.now() + probeMs
      return true
    },
    held: (err) => err.driverCode === heldCode,
    turn: (again = false) => new Promise<void>((resolve, reject) => {
      if (!again && running === 0) return resolve()
      if (again) waiting.unshift({ resolve, reject })
      else waiting.push({ resolve, reject })
      if (stall === undefined) armStall()
    }),
    holding: () => holding,
  }
}

/**
 * The connections that served a statement lately: each one's backend (postgres.js's stamp),
 * kept for the window of `windowMs` it last served in and the next. Windows turn lazily, every
 * 256 statements and at each count, so that a busy pool reads the clock rarely and the
 * backends of closed connections are let go.
 */
function createRecentBackends(windowMs: number) {
  let current = new Set<unknown>()
  let previous = new Set<unknown>()
  let turnedAt = performance.now()
  let count = 0
  const turn = () => {
    const now = performance.now()
    if (now - turnedAt < windowMs) return
    previous = now - turnedAt < 2 * windowMs ? current : new Set()
    current = new Set()
    turnedAt = now
  }
  return {
    served(backend: unknown) {
      if (!backend) return
      current.add(backend)
      if ((++count & 255) === 0) turn()
    },
    live(): number {
      turn()
      let n = current.size
      for (const b of previous) if (!current.has(b)) n++
      return n
    },
  }
}
