import { z } from 'zod'
import type { Inbound } from '../http/inbound.js'
import { FencegateError } from '../http/problems.js'
import { maxBulkStart, maxClaimBatch } from './store.js'

// The job API's request bodies. Each is strict: an unknown field is a client's mistake
// (a misspelt `worker_id` must not claim as nobody), answered as invalid_request.

const id = z.string().min(1).max(255)
export const startBody = z.object({ type: z.string(), key: id, payload: z.unknown().optional(), restart: z.boolean().optional() }).strict()
export const bulkStartBody = z.object({ jobs: z.array(startBody).min(1).max(maxBulkStart) }).strict()
/** The most job types one claim may name: each is an index scan per claim round. */
export const maxClaimTypes = 32

export const claimBody = z.object({
  // Under auth the token's sub is the worker: a claim may leave it out (src/leases/api-identity.ts).
  worker_id: id.optional(), types: z.array(z.string()).min(1).max(maxClaimTypes).optional(), wait: z.number().min(0).max(30).optional(),
  max: z.number().int().min(1).max(maxClaimBatch).optional(),
  // A batch for several slots of one process: one owner per job, so each slot holds its own leases.
  worker_ids: z.array(id).min(1).max(maxClaimBatch).optional(),
}).strict()
  .refine((b) => b.worker_ids === undefined || b.worker_id === undefined, { message: 'name the worker with worker_id or worker_ids, not both', path: ['worker_ids'] })
  .refine((b) => b.worker_ids === undefined || b.worker_ids.length === b.max, { message: 'worker_ids needs max, and one id per job of it', path: ['worker_ids'] })
export const holderBody = z.object({ worker_id: id, fence: z.string().regex(/^(0|[1-9][0-9]{0,18})$/) }).strict()
export const appendBody = holderBody.extend({ seq: z.number().int().min(0).max(1_000_000), chunk: z.unknown() }).strict()
export const completeBody = holderBody.extend({ result: z.unknown().optional() }).strict()
export const failBody = holderBody.extend({ error: z.unknown().optional(), retryable: z.boolean() }).strict()

const utf8 = new TextDecoder('utf-8', { fatal: true })

/**
 * Reads a JSON body and checks it against `schema`; any failure is `invalid_request`.
 *
 * @example
 * const body = await jsonBody(request, claimBody, config.server.max_request_body)
 */
export async function jsonBody<S extends z.ZodType>(request: Inbound, schema: S, limit: number): Promise<z.output<S>> {
  const bytes = await request.readBody(limit)
  let value: unknown
  try {
    value = JSON.parse(utf8.decode(bytes))
  } catch {
    throw new FencegateError('invalid_request', 'the body must be JSON')
  }
  // PostgreSQL's text and jsonb refuse NUL and lone surrogates: a client mistake, not a store failure.
  if (!isStorableJson(value)) throw new FencegateError('invalid_request', 'the body contains control characters or invalid Unicode in a string')
  const parsed = schema.safeParse(value)
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!
    throw new FencegateError('invalid_request', `${issue.path.join('.') || 'body'}: ${issue.message}`)
  }
  return parsed.data
}

function isStorableJson(value: unknown): boolean {
  if (typeof value === 'string') return value.isWellFormed() && !value.includes('\u0000')
  if (Array.isArray(value)) return value.every(isStorableJson)
  if (value && typeof value === 'object') return Object.entries(value).every(([k, v]) => isStorableJson(k) && isStorableJson(v))
  return true
}
