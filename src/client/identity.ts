import { FencegateClientError } from './errors.js'

/**
 * Who the worker is. Under `auth.mode: jwt` the gateway takes the worker from the token's
 * `sub`: a `worker_id` must be the `sub` or start with `sub + "/"`, else `403 worker_mismatch`.
 * The SDK follows that rule instead of inventing an id the gateway would refuse.
 */

/**
 * The `sub` of a JWT, read without verifying it: the gateway verifies every token, and the
 * SDK only needs to name itself as the gateway will see it. Undefined for a token that is not
 * a JWT or has no string `sub` (an opaque token, or none).
 *
 * @example
 * subjectOf(process.env.FENCEGATE_TOKEN) // 'host-1'
 */
export function subjectOf(token: string | undefined): string | undefined {
  const parts = token?.split('.')
  if (parts?.length !== 3) return undefined
  const payload = parts[1]!
  try {
    // base64url without padding, as JWTs encode; atob wants plain base64. No Buffer: the SDK imports nothing from node.
    const base64 = payload.replace(/-/g, '+').replace(/_/g, '/')
    const bytes = Uint8Array.from(atob(base64 + '='.repeat((4 - (base64.length % 4)) % 4)), (c) => c.charCodeAt(0))
    const claims: unknown = JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(bytes))
    const sub = (claims as { sub?: unknown } | null)?.sub
    return typeof sub === 'string' && sub.length > 0 ? sub : undefined
  } catch {
    return undefined
  }
}

/**
 * The worker id to use: `explicit` when given, else the token's `sub`, else `fallback()`.
 * An explicit id that the gateway would refuse for this token throws at once: a worker
 * whose every claim is refused would otherwise only log an error per claim, forever.
 *
 * @example
 * workerIdFor('host-1/blue', 'host-1', () => 'worker-x') // 'host-1/blue'
 * workerIdFor(undefined, 'host-1', () => 'worker-x')     // 'host-1'
 */
export function workerIdFor(explicit: string | undefined, subject: string | undefined, fallback: () => string): string {
  if (explicit === undefined) return subject ?? fallback()
  if (explicit.length === 0) throw new FencegateClientError('invalid_option', 'workerId must not be empty')
  if (subject === undefined || explicit === subject || explicit.startsWith(`${subject}/`)) return explicit
  throw new FencegateClientError('worker_mismatch', `workerId ${JSON.stringify(explicit)} is not the token's sub ${JSON.stringify(subject)} or a slot of it ("${subject}/…"): the gateway would refuse it (403 worker_mismatch)`)
}

/** The longest worker id the gateway accepts (src/leases/api-body.ts). */
export const maxWorkerIdLength = 255

/**
 * The id of one slot of a `work()` loop: `<id>/slot-<n>`, n from 1. Under auth each slot is
 * still its token's worker (the gateway accepts `sub/…`), and each lease names the slot that holds it.
 *
 * @example
 * slotId('host-1', 2) // 'host-1/slot-2'
 */
export const slotId = (workerId: string, n: number): string => `${workerId}/slot-${n}`
