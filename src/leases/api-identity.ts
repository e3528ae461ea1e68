import { adminScope, type Identity } from '../http/identity.js'
import { FencegateError } from '../http/problems.js'

/**
 * Who may do what on the job API under `auth.mode: jwt`: a scope per kind of verb, and the
 * worker is the token's subject. Without auth every caller holds every scope and names its
 * own worker, as before.
 */

/** The job API's scopes; `fencegate:admin` holds them all. */
export const jobScopes = {
  start: 'jobs:start',
  work: 'jobs:work',
  cancel: 'jobs:cancel',
  read: 'jobs:read',
} as const

export type JobScope = (typeof jobScopes)[keyof typeof jobScopes]

/**
 * Refuses a caller whose token lacks `scope` (or `fencegate:admin`): `403 insufficient_scope`.
 *
 * @example requireJobScope(identity, jobScopes.work)
 */
export function requireJobScope(identity: Identity, scope: JobScope): void {
  if (identity.scopes === null || identity.scopes.has(scope) || identity.scopes.has(adminScope)) return
  throw new FencegateError('insufficient_scope', `the job API's ${scope.slice('jobs:'.length)} verbs require the ${scope} scope`)
}

/**
 * The worker a request acts as. Under auth it is the token's `sub`, or a slot of it
 * (`sub/slot-3`: one process, several slots); a body naming another worker is refused with
 * `403 worker_mismatch`, so a worker's token cannot renew, append to, complete, fail or
 * release another worker's lease even when it knows the fence. A claim without `worker_id`
 * claims as `sub`. Without auth the body names the worker, and must.
 *
 * @example workerOf({ tenant: 'acme', caller: 'host-1', scopes: new Set() }, 'host-1/slot-2') // 'host-1/slot-2'
 */
export function workerOf(identity: Identity, given: string | undefined): string {
  if (identity.scopes === null) {
    if (given === undefined) throw new FencegateError('invalid_request', 'worker_id is required')
    return given
  }
  const subject = identity.caller
  if (subject === null) throw new FencegateError('worker_mismatch', 'the token has no sub, so it names no worker')
  if (given === undefined) return subject
  if (given === subject || given.startsWith(`${subject}/`)) return given
  throw new FencegateError('worker_mismatch', 'worker_id must be the token\'s sub or start with it and "/"')
}
