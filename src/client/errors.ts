/**
 * Errors of the worker SDK. Each has a stable `code` to branch on; messages
 * are for people. None carries a body, a result or a token.
 */

/**
 * Why a lease is no longer held. All but `deadline` come from the server's
 * `409 lease_lost`/`not_owner` (and `404`); `released` is also set locally.
 */
export type LostReason =
  | 'expired' | 'superseded' | 'cancelled' | 'finished' | 'max_runtime' | 'not_found'
  /** The last confirmed deadline passed on the local monotonic clock without a renewal. */
  | 'deadline'
  /** The worker gave the job back (graceful shutdown, or `lease.release()`), or the server says it is back in the queue at this fence. */
  | 'released'

/**
 * The base class of every SDK error.
 *
 * @example
 * try { await lease.append(chunk) } catch (err) { if (err instanceof FencegateClientError) log(err.code) }
 */
export class FencegateClientError extends Error {
  constructor(readonly code: string, message: string) {
    super(message)
    this.name = new.target.name
  }
}

/**
 * The lease is gone: the server refused it, its confirmed deadline passed, or
 * the worker released it. Nothing more is sent under it.
 *
 * @example
 * if (lease.signal.reason instanceof LeaseLost) console.log(lease.signal.reason.reason)
 */
export class LeaseLost extends FencegateClientError {
  constructor(readonly jobId: string, readonly fence: string, readonly reason: LostReason) {
    super('lease_lost', `job ${jobId}: fence ${fence} no longer holds the lease (${reason})`)
  }
}

/**
 * A renewal failed or timed out, and the last confirmed deadline has not
 * passed yet: the worker may still own the job, or may not. No new
 * irreversible step starts in this state.
 *
 * @example
 * await lease.step('charge', charge, { ifUnknown: 'throw' }).catch((e) => e instanceof OwnershipUnknown && retryLater())
 */
export class OwnershipUnknown extends FencegateClientError {
  constructor(readonly jobId: string) {
    super('ownership_unknown', `job ${jobId}: the last renewal was not confirmed; ownership is unknown`)
  }
}

/**
 * Someone cancelled the job; the server told the owner in a heartbeat. The SDK
 * ends the attempt with `fail`, which the server turns into `cancelled`.
 *
 * @example
 * if (lease.signal.reason instanceof JobCancelled) return
 */
export class JobCancelled extends FencegateClientError {
  constructor(readonly jobId: string) {
    super('job_cancelled', `job ${jobId} was cancelled`)
  }
}

/**
 * The server answered with a problem the SDK does not turn into a lease
 * state, e.g. `sequence_conflict` or `unknown_job_type`. `code` is the
 * server's stable code; `problem` is the parsed problem+json. A claim never
 * throws `too_many_waiting_claims` (429): the SDK asks again after its
 * `Retry-After` while the claim's `wait` lasts, then returns no job.
 *
 * @example
 * catch (err) { if (err instanceof ProblemError && err.code === 'sequence_conflict') resync(err.problem.cursor_length) }
 */
export class ProblemError extends FencegateClientError {
  constructor(readonly status: number, code: string, readonly problem: Record<string, unknown>) {
    super(code, `${status} ${code}${typeof problem.detail === 'string' ? `: ${problem.detail}` : ''}`)
  }
}

/**
 * The gateway could not be reached, or did not answer within the call's
 * deadline. The call's outcome on the server is unknown.
 *
 * @example
 * catch (err) { if (err instanceof GatewayUnreachable) scheduleRetry() }
 */
export class GatewayUnreachable extends FencegateClientError {
  constructor(what: string, override readonly cause: unknown) {
    super('gateway_unreachable', `${what}: the gateway did not answer (${cause instanceof Error ? cause.name : 'error'})`)
  }
}

/**
 * Thrown by a handler to fail the job for good (`retryable: false`); any other
 * error fails the attempt retryably.
 *
 * @example
 * if (!job.payload.account) throw new PermanentFailure('no account in payload')
 */
export class PermanentFailure extends FencegateClientError {
  constructor(message: string) {
    super('permanent_failure', message)
  }
}
