/**
 * The fencegate worker SDK (`fencegate/client`): claim jobs, keep their leases,
 * fence every side effect, stop when the lease is lost. Runtime-neutral: it
 * needs only fetch, AbortController and timers.
 *
 * @example
 * import { FencegateClient } from 'fencegate/client'
 * const client = new FencegateClient({ baseUrl: 'http://127.0.0.1:8080' })
 * await client.work({ types: ['report'], signal }, async (job, lease) => ({ done: job.id, fence: lease.fence }))
 */
export { FencegateClient } from './client.js'
export type { ClaimOptions, FencegateClientOptions } from './client.js'
export type { DrainReason, SlotEvent } from './slots.js'
export type { Handler, WorkEvent, WorkOptions, WorkResult } from './work.js'
export { FencegateClientError, GatewayUnreachable, JobCancelled, LeaseLost, OwnershipUnknown, PermanentFailure, ProblemError } from './errors.js'
export type { LostReason } from './errors.js'
export type { FetchLike } from './http.js'
export { Lease } from './lease.js'
export type { Job, Ownership, StepOptions } from './types.js'
