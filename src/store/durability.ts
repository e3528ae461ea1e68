import type { Logger } from '../observe/log.js'
import { StoreError, type Db } from './db.js'
import { judgeChange, type Verdict } from './lost-commits.js'
import { compareLsn, readPosition, readStoreState, type StoreState, type WalPosition } from './wal.js'

/**
 * What the store can lose, and the refusals that follow from it.
 *
 * A commit is only as safe as its replication: with asynchronous standbys a failover forgets
 * what the primary confirmed last, and a forgotten fence or key lets a stale worker write
 * again. So the gateway reads (about once a second) whether its commits wait for a standby,
 * and remembers the WAL position of the last write it acknowledged. Every command statement
 * returns its timeline and the server's start time (src/store/wal.ts); when either changed,
 * the command waits for a check before anything is forwarded:
 * - another system identifier: a different cluster behind the address (`store_identity_changed`);
 * - a new timeline whose fork point is at or below the last acknowledged write: the
 *   failover lost commits this gateway confirmed (`store_lost_commits`);
 * - the same timeline after a restart, with the WAL behind that write: lost the same way.
 * Each of these refuses every command until the gateway is restarted. A failover that lost
 * nothing is logged (`store_failover`) and served at once.
 */

export type DurabilityLevel = 'replicated' | 'local' | 'unknown'

/** Why commands are refused while the store is up. */
export type DurabilityRefusalCode = 'store_not_replicated' | 'store_identity_changed' | 'store_lost_commits'

/** A refusal of the store's durability: nothing was forwarded. */
export class DurabilityRefusal extends Error {
  override name = 'DurabilityRefusal'
  /**
   * @param ran the refused statement was run (the refusal came while it waited for a standby,
   *   or after it returned): what it wrote may be committed, though nothing was forwarded.
   */
  constructor(readonly code: DurabilityRefusalCode, readonly detail: string, readonly ran = false) {
    super(detail)
  }
}

export interface DurabilityStatus {
  level: DurabilityLevel
  /** Set while every command is refused. */
  refusing?: DurabilityRefusalCode
  timeline?: number
}

/** The last write one worker acknowledged: an LSN, and the timeline it was written on. */
export interface AckedPosition {
  timeline: number
  lsn: string
}

/**
 * The other processes of one gateway (`server.workers > 1`, src/runtime/node/cluster-worker.ts).
 * Each worker acknowledges its own commands, so a failover that lost only another worker's
 * commits would look clean to this one: a change is judged against every worker's last
 * acknowledged write, and a refusal one worker reaches holds for all of them.
 */
export interface DurabilityPeers {
  /** Every other live worker's last acknowledged write, or undefined when one did not answer. */
  acknowledged(): Promise<(AckedPosition | undefined)[] | undefined>
  /** Tells the other workers, and those started later, that this gateway refuses. */
  refuse(code: DurabilityRefusalCode, detail: string): void
  /** Receives a refusal another worker reached, at once if one was reached before (a restarted worker inherits it). */
  onRefusal(handler: (code: DurabilityRefusalCode, detail: string) => void): void
}

export interface Durability {
  status(): DurabilityStatus
  /** This process's last acknowledged write on the timeline it knows, if any (for its peers). */
  acknowledged(): AckedPosition | undefined
  /** Throws a DurabilityRefusal when no command may be served now. */
  admit(): void
  /** `pending`, or a DurabilityRefusal when replication is lost while it waits (require_replicated only). */
  during<T>(pending: Promise<T>): Promise<T>
  /** A command statement's position; resolves once any change it shows is checked (throws a DurabilityRefusal). */
  observe(position: WalPosition | undefined): Promise<void>
  close(): void
}

/** The durability of a store that cannot lose a write to a failover it does not have (PGlite), or of none checked. */
export const localDurability: Durability = {
  status: () => ({ level: 'local' }),
  acknowledged: () => undefined,
  admit() {},
  during: (pending) => pending,
  observe: async () => {},
  close() {},
}

export interface DurabilityOptions {
  log: Logger
  /** `store.require_replicated`: refuse commands while durability is not `replicated`. */
  requireReplicated: boolean
  /** How often the store's replication is read (1000 ms). */
  everyMs?: number
  /** How long a reading may take before it counts as unknown (1000 ms). */
  readTimeoutMs?: number
  /** The gateway's other workers, when it has several. */
  peers?: DurabilityPeers
}

/**
 * Watches a PostgreSQL store's durability. Resolves after the first reading, which is logged
 * as a warning (`store_durability_local`) when commits wait for no standby.
 *
 * @example
 * const durability = await watchDurability(db, { log, requireReplicated: config.store.require_replicated })
 * durability.status() // { level: 'replicated', timeline: 2 }
 */
export async function watchDurability(db: Db, options: DurabilityOptions): Promise<Durability> {
  const watch = new DurabilityWatch(db, options)
  await watch.read().catch(() => watch.setLevel('unknown'))
  watch.readEvery(options.everyMs ?? 1000)
  return watch
}

const notReplicated = () => new DurabilityRefusal('store_not_replicated', 'store.require_replicated is set and no synchronous standby confirms commits now; nothing was forwarded')

/** One PostgreSQL store's durability: its level as last read, and the state a change is judged against. */
class DurabilityWatch implements Durability {
  private level: DurabilityLevel = 'unknown'
  private refusal: DurabilityRefusal | undefined
  private known: StoreState | undefined
  private acked: string | undefined
  private checking: Promise<void> | undefined
  private timer: ReturnType<typeof setInterval> | undefined
  private readonly waiters = new Set<(err: DurabilityRefusal) => void>()
  private readonly log: Logger
  private readonly requireReplicated: boolean
  private readonly peers: DurabilityPeers | undefined
  private readonly readTimeoutMs: number

  constructor(private readonly db: Db, options: DurabilityOptions) {
    this.log = options.log
    this.requireReplicated = options.requireReplicated
    this.peers = options.peers
    this.readTimeoutMs = options.readTimeoutMs ?? 1000
    this.peers?.onRefusal((code, detail) => {
      if (!this.refusal) this.log.error(code, { reached_by: 'another worker' })
      this.refuse(code, detail)
    })
  }

  acknowledged(): AckedPosition | undefined {
    return this.acked && this.known ? { timeline: this.known.timeline, lsn: this.acked } : undefined
  }

  status(): DurabilityStatus {
    const { level, refusal, known } = this
    return { level, ...(refusal ? { refusing: refusal.code } : this.requireReplicated && level !== 'replicated' ? { refusing: 'store_not_replicated' as const } : {}), ...(known ? { timeline: known.timeline } : {}) }
  }

  admit(): void {
    if (this.refusal) throw this.refusal
    if (this.requireReplicated && this.level !== 'replicated') throw notReplicated()
  }

  during<T>(pending: Promise<T>): Promise<T> {
    if (!this.requireReplicated) return pending
    return new Promise((resolve, reject) => {
      this.waiters.add(reject)
      pending.then(resolve, reject).finally(() => this.waiters.delete(reject))
    })
  }

  async observe(position: WalPosition | undefined): Promise<void> {
    if (!position) return
    const known = this.known
    const moved = known !== undefined && (position.timeline !== known.timeline || position.boot !== known.boot)
    if (moved && !this.checking) {
      const state = await readStoreState(this.db)
      if (state) await this.judge(state)
    }
    if (this.checking) await this.checking
    if (this.refusal) throw this.refusal
    if (position.lsn && this.known && position.timeline === this.known.timeline && (!this.acked || compareLsn(position.lsn, this.acked) > 0)) this.acked = position.lsn
  }

  close(): void {
    clearInterval(this.timer)
  }

  readEvery(ms: number): void {
    this.timer = setInterval(() => void this.read().catch(() => this.setLevel('unknown')), ms)
    this.timer.unref?.()
  }

  async read(): Promise<void> {
    const state = await withTimeout(readStoreState(this.db), this.readTimeoutMs)
    if (!state) return this.setLevel('unknown')
    const known = this.known
    if (!known) this.known = state
    else if (state.systemId !== known.systemId || state.timeline !== known.timeline || state.boot !== known.boot) await this.judge(state)
    this.setLevel(state.replicated ? 'replicated' : 'local')
  }

  setLevel(next: DurabilityLevel): void {
    if (next === this.level) return
    const before = this.level
    this.level = next
    if (before !== 'unknown' || next === 'local') this.log[next === 'replicated' ? 'info' : 'warn'](next === 'local' && before === 'unknown' ? 'store_durability_local' : 'store_durability_changed', { from: before, to: next })
    if (this.requireReplicated && next !== 'replicated') for (const fail of this.waiters) fail(notReplicated())
  }

  private refuse(code: DurabilityRefusalCode, detail: string): DurabilityRefusal {
    return (this.refusal ??= new DurabilityRefusal(code, detail))
  }

  /** A change of timeline or boot seen by a reading or a command: judged once, in turn (src/store/lost-commits.ts). */
  private judge(seen: StoreState): Promise<void> {
    return (this.checking = (this.checking ?? Promise.resolve()).then(async () => {
      if (this.refusal || !this.known) return
      const verdict = await judgeWithPeers(this.db, this.known, seen, this.acked, this.peers)
      if (verdict.kind === 'refuse') {
        this.refuse(verdict.code, verdict.detail)
        this.peers?.refuse(verdict.code, verdict.detail)
        return this.log.error(verdict.code, verdict.fields)
      }
      if (verdict.kind === 'failover') {
        this.log.warn('store_failover', verdict.fields)
        this.acked = undefined
      }
      this.known = seen
    }).finally(() => (this.checking = undefined)))
  }
}

/**
 * Runs a store decision the way every one that hands out a fence or a key must: admitted by
 * the durability, raced against replication being lost (`during`), and its WAL position
 * checked before its result may be acted on. Reservations (src/store/store.ts) and claims
 * (src/leases/store.ts) both go through it.
 *
 * @example
 * const { reservation } = await durably(durability, () => reserve(db, command), (r) => r.position)
 */
export async function durably<T>(durability: Durability, run: () => Promise<T>, positionOf: (result: T) => WalPosition | undefined): Promise<T> {
  durability.admit()
  try {
    const result = await durability.during(run())
    await durability.observe(positionOf(result))
    return result
  } catch (err) {
    // The refusal the monitor keeps is shared; this command's says that its statement ran.
    throw err instanceof DurabilityRefusal ? new DurabilityRefusal(err.code, err.detail, true) : err
  }
}

/**
 * `judgeChange` against the furthest write any worker of the gateway acknowledged on the
 * timeline it knew. A worker that does not answer may have acknowledged anything: when the
 * timeline or the boot changed, that is judged as lost commits (fail closed).
 */
async function judgeWithPeers(db: Db, known: StoreState, seen: StoreState, acked: string | undefined, peers: DurabilityPeers | undefined): Promise<Verdict> {
  if (!peers || seen.systemId !== known.systemId) return judgeChange(db, known, seen, acked)
  const theirs = await peers.acknowledged()
  if (!theirs) {
    return {
      kind: 'refuse', code: 'store_lost_commits', fields: { from_timeline: known.timeline, to_timeline: seen.timeline, unanswered: 'worker' },
      detail: 'the store failed over or restarted, and a worker of this gateway did not say what it acknowledged; nothing is served until the gateway is restarted',
    }
  }
  const onKnown = theirs.filter((p): p is AckedPosition => p?.timeline === known.timeline).map((p) => p.lsn)
  const furthest = [acked, ...onKnown].reduce<string | undefined>((a, b) => (b && (!a || compareLsn(b, a) > 0) ? b : a), undefined)
  return judgeChange(db, known, seen, furthest)
}

/** `pending`'s value, or undefined when it takes longer than `ms` (its failure counts the same). */
async function withTimeout<T>(pending: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const late = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), ms)
  })
  try {
    return await Promise.race([pending.catch((err: unknown) => {
      if (err instanceof StoreError) return undefined
      throw err
    }), late])
  } finally {
    clearTimeout(timer)
  }
}

export { readPosition, type WalPosition }
