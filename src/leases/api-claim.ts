import type { Answer } from '../http/exchange.js'
import { FencegateError, retryAfter } from '../http/problems.js'
import { claimBody, jsonBody } from './api-body.js'
import { jsonAnswer, noContent, type JobCall, type JobSpanNotes, type JobsContext } from './api-context.js'
import { workerOf } from './api-identity.js'
import type { Claimed, ClaimRequest } from './store.js'
import { TooManyWaiting } from './wake.js'

/**
 * `POST /_fencegate/jobs/claim`: the earliest claimable job (or, with `max`, up to that
 * many), each under a new fence and lease. With `wait`, a claim that finds nothing waits
 * for a start's notification or its group's shared poll (src/leases/wake.ts) until its
 * deadline; a tenant with `job_waiting_claims` claims waiting already gets `429 too_many_waiting_claims`.
 *
 * @example
 * // POST /_fencegate/jobs/claim {"worker_id":"w1","wait":10} → 200 {"job_id":"7","fence":"3","worker_id":"w1",…} or 204
 * // POST /_fencegate/jobs/claim {"worker_ids":["h/slot-1","h/slot-2"],"max":2} → 200 {"jobs":[{…,"worker_id":"h/slot-1"},…]}
 */
export async function claimHandler(ctx: JobsContext, { request, requestId, identity, notes }: JobCall): Promise<Answer> {
  const body = await jsonBody(request, claimBody, ctx.limit)
  const wanted = ctx.typesFor(body.types)
  // Every id is checked against the token before anything is claimed: one foreign slot refuses the whole claim.
  const workerIds = body.worker_ids?.map((given) => workerOf(identity, given))
  // The token's sub is recorded as the holder (null without auth): what every holder check compares.
  const claim = { tenant: identity.tenant, workerId: workerIds?.[0] ?? workerOf(identity, body.worker_id), workerIds, sub: identity.caller, types: wanted, max: body.max }
  // With `max`, the answer is a list (`{"jobs": [...]}`); without it, the one job itself, as before.
  const answer = (claimed: Claimed[]) => {
    if (notes) noteClaim(notes, claimed, body.max !== undefined)
    if (claimed.length === 0) return undefined
    const shown = claimed.map(({ state: _state, reclaimed: _reclaimed, ...one }) => one)
    return jsonAnswer(200, body.max === undefined ? shown[0]! : { jobs: shown }, requestId)
  }
  if (!body.wait) return answer(await claimRound(ctx, claim)) ?? noContent(requestId)
  // The deadline is a request timeout, so the process's monotonic clock is right for it;
  // whether a job is due or a lease expired is decided by the claim statement on the database clock.
  const deadline = performance.now() + body.wait * 1000
  const waiter = await ctx.wake.register(wanted.map((t) => t.name), deadline, identity.tenant).catch(refuseOverCap)
  // Whether the answer carries a job: a shared poll that found one goes on to another waiter.
  let found = false
  try {
    for (;;) {
      const claimed = answer(await claimRound(ctx, claim))
      if (claimed) {
        found = true
        return claimed
      }
      const why = await waiter.next(deadline, request.signal)
      // A client that left gets no job: a claim nobody reads would only burn an attempt.
      if (why === 'aborted') return noContent(requestId)
      // One last look at the deadline, then nothing.
      if (why === 'deadline') {
        const last = answer(await claimRound(ctx, claim))
        found = last !== undefined
        return last ?? noContent(requestId)
      }
    }
  } finally {
    waiter.release(found)
  }
}

/**
 * A waiting claim over its tenant's cap is refused before it reads the store: held, it would
 * be one more claim per wake-up, and answered `204` at once, a worker would claim again at once.
 */
function refuseOverCap(err: unknown): never {
  if (!(err instanceof TooManyWaiting)) throw err
  throw new FencegateError('too_many_waiting_claims',
    `this gateway process already holds ${err.limit} waiting claim${err.limit === 1 ? '' : 's'} of this tenant, its most; claim again after Retry-After, or without wait`,
    { waiting_limit: err.limit }, retryAfter(1000))
}

/**
 * A claim's span: the one job's id and new fence, or for a claim with `max` only how many
 * (a list of up to 100 ids is no attribute to search by, and the first alone would read as
 * the only one). Each round overwrites the last, so a wait that ends empty says `none`.
 */
function noteClaim(notes: JobSpanNotes, claimed: Claimed[], batch: boolean): void {
  notes.outcome = claimed.length === 0 ? 'none' : 'claimed'
  if (batch) notes.count = claimed.length
  else if (claimed[0]) {
    notes.jobId = claimed[0].job_id
    notes.fence = claimed[0].fence
  }
}

/** Claims once; jobs out of attempts are finished by the claim itself, so it goes on until one runs or none is left. */
async function claimRound(ctx: JobsContext, c: ClaimRequest & { max: number | undefined }): Promise<Claimed[]> {
  for (let i = 0; i < 100; i++) {
    const request = { tenant: c.tenant, workerId: c.workerId, sub: c.sub ?? null, ...(c.workerIds ? { workerIds: c.workerIds } : {}), types: c.types }
    // claimOne keeps its own store-call metric (call="claimOne") for one-job claims.
    const all = c.max === undefined ? [await ctx.jobs.claimOne(request)].filter((one) => one !== undefined) : await ctx.jobs.claimJobs({ ...request, max: c.max })
    if (all.length === 0) return []
    const claimed = all.filter((one) => one.state === 'running')
    if (claimed.length === 0) continue
    for (const one of claimed) {
      ctx.log.info('job_claimed', { job_id: one.job_id, fence: one.fence, attempt: one.attempt })
      ctx.metrics.jobClaimed({ type: one.type, reclaimed: one.reclaimed })
    }
    return claimed
  }
  return []
}
