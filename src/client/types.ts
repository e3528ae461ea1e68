import type { JobApi } from './http.js'

/**
 * A claimed job, as the handler sees it.
 *
 * @example
 * const { account } = job.payload as { account: string }
 */
export interface Job<P = unknown> {
  id: string
  type: string
  payload: P
  fence: string
  attempt: number
}

/**
 * What the worker knows about its lease: confirmed, unconfirmed but not yet past the deadline, or gone.
 *
 * @example
 * if (lease.ownership !== 'owner') await lease.changed()
 */
export type Ownership = 'owner' | 'unknown' | 'lost'

/**
 * What to do when a step would start while ownership is unknown.
 *
 * @example
 * await lease.step('charge', charge, { ifUnknown: 'throw' })
 */
export interface StepOptions {
  /** `wait` (default) until a renewal is confirmed or the lease is lost; `throw` OwnershipUnknown at once. */
  ifUnknown?: 'wait' | 'throw'
}

/** How a Lease starts: the claim's answer, with the lease durations the database measured. */
export interface LeaseInit {
  api: JobApi
  jobId: string
  fence: string
  workerId: string
  attempt: number
  /** The job type's lease length (`lease_ms`): renewals run every third of it. */
  leaseMs: number
  /** The lease left when the claim statement ran (`lease_remaining_ms`), by the database clock. */
  remainingMs: number
  /** The local monotonic time the claim was sent: the lease cannot have started before it. */
  claimSentAt: number
  cursor: number
  requestTimeoutMs: number
}
