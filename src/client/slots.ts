import { JobCancelled, type LeaseLost } from './errors.js'
import { monotonic } from './http.js'
import type { Lease } from './lease.js'
import type { Job } from './types.js'

/**
 * Why a slot is draining: its lease was lost, its job cancelled, or the lease released
 * (by the handler itself; at the end of the shutdown grace period the worker stops waiting instead).
 *
 * @example
 * onEvent: (e) => { if (e.type === 'draining' && e.why === 'lost') log.warn('handler ignores lease.signal', e.jobId) }
 */
export type DrainReason = 'lost' | 'cancelled' | 'released'

/**
 * The slot accounting events of `work()`: a job's handler ran on after its lease ended
 * (`draining`) and then settled (`drained`), or every slot is draining at once.
 *
 * @example
 * onEvent: (e) => { if (e.type === 'all_slots_draining') alert(`all ${e.slots} slots hold handlers that ignore lease.signal`) }
 */
export type SlotEvent =
  | { type: 'draining'; jobId: string; jobType: string; fence: string; why: DrainReason; slotsDraining: number }
  | { type: 'drained'; jobId: string; jobType: string; fence: string; durationMs: number; slotsDraining: number }
  /** `jobId` is the job whose slot was the last to start draining. */
  | { type: 'all_slots_draining'; jobId: string; slots: number }

/** How a lease ended, in the words of the worker's events. */
export function endedBy(lease: Lease): DrainReason {
  const reason = lease.signal.reason as LeaseLost | JobCancelled
  if (reason instanceof JobCancelled) return 'cancelled'
  return reason.reason === 'released' ? 'released' : 'lost'
}

/**
 * The draining slots of one `work()` loop. A slot is taken from claim until its handler
 * settles; this counts the taken slots whose lease has already ended, so a worker whose
 * handlers ignore `lease.signal` says so instead of quietly claiming no more.
 */
export class Slots {
  private readonly draining = new Map<string, number>()
  private saidAll = false

  constructor(readonly size: number, private readonly emit: (e: SlotEvent) => void) {}

  /** How many slots hold a handler whose lease has ended. */
  get drainingCount(): number {
    return this.draining.size
  }

  /** The job's lease ended but its handler runs on: its slot stays taken until `drained`. */
  drain(job: Job, why: DrainReason): void {
    // Keyed by job and fence: a successor attempt of the same job may run in another slot meanwhile.
    this.draining.set(`${job.id}@${job.fence}`, monotonic())
    this.emit({ type: 'draining', jobId: job.id, jobType: job.type, fence: job.fence, why, slotsDraining: this.draining.size })
    if (this.draining.size < this.size || this.saidAll) return
    // Once per episode: said again only after a slot has freed.
    this.saidAll = true
    this.emit({ type: 'all_slots_draining', jobId: job.id, slots: this.size })
  }

  /** The draining job's handler settled: its slot is free for the next claim. */
  drained(job: Job): void {
    const key = `${job.id}@${job.fence}`
    const since = this.draining.get(key)
    if (since === undefined) return
    this.draining.delete(key)
    this.saidAll = false
    this.emit({ type: 'drained', jobId: job.id, jobType: job.type, fence: job.fence, durationMs: Math.round(monotonic() - since), slotsDraining: this.draining.size })
  }
}
