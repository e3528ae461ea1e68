/** The lease service's shared vocabulary: a job's states, who holds it, and why a holder lost it. */

/** The states a job moves through (docs/leases.md#states). */
export type JobState = 'queued' | 'running' | 'succeeded' | 'failed' | 'cancelled'

/** Who is acting on a job: the owner's worker id and the fence it was given at claim. */
export interface Holder {
  tenant: string
  jobId: string
  workerId: string
  fence: string
  /**
   * The subject that holds the lease: the token's `sub` under auth, compared exactly with the
   * one the claim recorded (never by the worker id's prefix). Absent or null without auth.
   */
  sub?: string | null
}

/**
 * Why a holder no longer holds a job. `released`: the job is back in the queue,
 * unowned, at the holder's fence (given back by release or a retryable fail, and
 * not claimed since).
 */
export type LostReason = 'expired' | 'superseded' | 'released' | 'cancelled' | 'finished' | 'max_runtime' | 'not_found'
