// The waiting claims of one process (src/leases/wake.ts is the public face): each is a
// member of the poll group of its tenant and types, which polls the store for all of them.

/** Why a waiting claim woke up. */
export type WakeReason = 'notified' | 'reconnected' | 'tick' | 'deadline' | 'aborted'

/** One waiting claim, from before its first claim attempt until it answers. */
export interface Waiter {
  /**
   * Resolves when the claim should try again: at once if a wake-up (a notification for one of
   * its types, a re-listen, or its group's poll) arrived since the last call, else on the next
   * one, at `deadline` (`performance.now()` milliseconds) or when `signal` aborts.
   */
  next(deadline: number, signal: AbortSignal): Promise<WakeReason>
  /**
   * Stops listening for this claim; a pending `next` resolves `aborted`. `found` says its last
   * attempt claimed a job: if that attempt was its group's poll, the poll goes on to another
   * waiter of the group, since more jobs may be claimable (see {@link PollGroup}).
   */
  release(found?: boolean): void
}

/**
 * Repeats `onTick` every `ms` milliseconds until the returned function is called: the
 * fallback poll's clock, one per poll group. A test passes its own to fire polls by hand.
 *
 * @example
 * const stop = intervalTicker(1000, () => group.poll())
 */
export type Ticker = (ms: number, onTick: () => void) => () => void

/** The default {@link Ticker}: `setInterval`. */
export const intervalTicker: Ticker = (ms, onTick) => {
  const timer = setInterval(onTick, ms)
  return () => clearInterval(timer)
}

/** The counters a wake reports (`WakeStats`), kept here where they happen. */
export interface WakeCounts {
  waiting: number
  notified: number
  ticks: number
  reconnects: number
}

/**
 * The waiting claims of one process: every one of them (notifications and re-listens wake
 * them by their wake keys), by poll group, and how many each tenant has.
 */
export class Waiters {
  readonly all = new Set<WaiterState>()
  readonly counts: WakeCounts = { waiting: 0, notified: 0, ticks: 0, reconnects: 0 }
  private readonly groups = new Map<string, PollGroup>()
  private readonly perTenant = new Map<string, number>()

  constructor(private readonly timing: { fallbackMs: number; ticker: Ticker; maxPerTenant: number }) {}

  /**
   * A new waiter for these wake keys (`wakeKey(type, tenant)`), in the poll group of exactly
   * this set of keys; undefined when the tenant already has `maxPerTenant` waiters.
   */
  add(keys: string[], tenant: string): WaiterState | undefined {
    const held = this.perTenant.get(tenant) ?? 0
    if (held >= this.timing.maxPerTenant) return undefined
    this.perTenant.set(tenant, held + 1)
    const sorted = [...new Set(keys)].sort()
    // Wake keys carry the tenant, so a group is one tenant's and one set of types'.
    const id = JSON.stringify(sorted)
    let group = this.groups.get(id)
    if (!group) {
      const created = new PollGroup(id, this.counts)
      group = created
      this.groups.set(id, created)
      created.stop = this.timing.ticker(this.timing.fallbackMs, () => created.tick())
    }
    const waiter = new WaiterState(new Set(sorted), this, group, tenant)
    group.members.add(waiter)
    this.all.add(waiter)
    return waiter
  }

  /** Takes a waiter out of its tenant's count and its group; a group left empty stops polling. */
  remove(waiter: WaiterState): void {
    if (!this.all.delete(waiter)) return
    const held = (this.perTenant.get(waiter.tenant) ?? 1) - 1
    if (held === 0) this.perTenant.delete(waiter.tenant)
    else this.perTenant.set(waiter.tenant, held)
    const group = waiter.group
    group.members.delete(waiter)
    if (group.members.size === 0) {
      group.stop()
      this.groups.delete(group.id)
    }
  }

  /** Groups polling now: one fallback poll each per tick, however many waiters they hold. */
  groupCount(): number {
    return this.groups.size
  }
}

/**
 * The waiting claims of one tenant and one set of types. Any of them would claim the same
 * jobs, so on each tick one of them looks (a blocked one first, in turn) and the rest stay
 * asleep: N waiters cost the store one claim statement per tick, not N. A look that claimed
 * a job hands the poll on to the next waiter, as there may be more; one that found nothing
 * ends it, since none of the others would have found anything either.
 */
export class PollGroup {
  /** In turn order: the one that polled last goes to the back. */
  readonly members = new Set<WaiterState>()
  stop: () => void = () => {}

  constructor(readonly id: string, private readonly counts: WakeCounts) {}

  tick(): void {
    this.counts.ticks++
    this.poll()
  }

  /** Wakes one member (not `except`) to poll for the group, preferring one blocked in `next`. */
  poll(except?: WaiterState): void {
    let chosen: WaiterState | undefined
    for (const w of this.members) {
      if (w === except) continue
      chosen ??= w
      if (w.blocked) {
        chosen = w
        break
      }
    }
    if (!chosen) return
    this.members.delete(chosen)
    this.members.add(chosen)
    chosen.wake('tick')
  }
}

/**
 * One registered claim. A wake-up while it is not waiting is kept for its next `next`, and
 * `poll` follows its group's poll through it: `owed` when handed the poll, `running` while
 * the attempt that makes it runs, so a poll it cannot finish goes on to another member.
 */
export class WaiterState implements Waiter {
  private pending: WakeReason | undefined
  private settle: ((reason: WakeReason) => void) | undefined
  private poll: 'none' | 'owed' | 'running' = 'none'

  constructor(readonly keys: Set<string>, private readonly home: Waiters, readonly group: PollGroup, readonly tenant: string) {}

  get blocked(): boolean {
    return this.settle !== undefined
  }

  wake(reason: WakeReason): void {
    if (reason === 'tick') this.poll = 'owed'
    if (!this.settle) {
      this.pending ??= reason
      return
    }
    if (reason === 'notified') this.home.counts.notified++
    this.settle(reason)
  }

  next(deadline: number, signal: AbortSignal): Promise<WakeReason> {
    // Called after an attempt that found nothing: a poll that attempt made is done.
    if (this.poll === 'running') this.poll = 'none'
    if (signal.aborted || !this.home.all.has(this)) return Promise.resolve('aborted')
    if (this.pending) {
      const reason = this.pending
      this.pending = undefined
      return Promise.resolve(this.begin(reason))
    }
    const remaining = deadline - performance.now()
    if (remaining <= 0) return Promise.resolve(this.begin('deadline'))
    const { counts } = this.home
    return new Promise((resolve) => {
      counts.waiting++
      const timer = setTimeout(() => this.settle?.('deadline'), remaining)
      const onAbort = () => this.settle?.('aborted')
      signal.addEventListener('abort', onAbort, { once: true })
      this.settle = (reason) => {
        this.settle = undefined
        counts.waiting--
        clearTimeout(timer)
        signal.removeEventListener('abort', onAbort)
        resolve(this.begin(reason))
      }
    })
  }

  /** The attempt that follows this wake-up makes the poll this waiter owes, if it owes one. */
  private begin(reason: WakeReason): WakeReason {
    if (reason !== 'aborted' && this.poll === 'owed') this.poll = 'running'
    return reason
  }

  release(found = false): void {
    const handOn = this.poll === 'owed' || (this.poll === 'running' && found)
    this.poll = 'none'
    this.home.remove(this)
    this.settle?.('aborted')
    // A poll it never made, or one that claimed a job (there may be more), is made by another member.
    if (handOn) this.group.poll(this)
  }
}
