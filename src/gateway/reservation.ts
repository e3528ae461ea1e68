import type { Answer } from '../http/exchange.js'
import { idempotencyWaitOf } from '../config/schema.js'
import { FencegateError, retryAfter } from '../http/problems.js'
import type { Command, Reservation } from '../store/store.js'
import type { PipelineContext } from './context.js'
import { staleFenceError } from './fence.js'
import { replayAnswer } from './idempotency.js'
import { inProgressRetryMs } from './retry-hint.js'
import { addElapsed, type Trace } from './trace.js'

/** Presents the command to the store in one call (one round trip, one transaction); a fence it accepts is written as the entity's highest. */
export async function reserve(ctx: Pick<PipelineContext, 'store' | 'metrics'>, command: Command, trace: Trace): Promise<Reservation> {
  const started = performance.now()
  let r: Reservation
  try {
    r = await ctx.store.reserve(command)
  } finally {
    addElapsed(trace, 'storeMs', started)
  }
  if (command.fence !== null && r.kind !== 'stale' && r.kind !== 'lease_expired') ctx.metrics.highestFenceUpdated({ route: command.route })
  // The key's part of the decision, for the request's span: a refused fence decided nothing about it.
  if (command.idempotency && r.kind !== 'stale' && r.kind !== 'lease_expired') trace.idempotencyOutcome = r.kind === 'proceed' ? 'reserved' : r.kind
  return r
}

/** Turns the store's decision into an answer (a replay), or undefined when the request may go upstream; refusals throw. */
export async function answerReservation(ctx: Pick<PipelineContext, 'store' | 'metrics' | 'outcomeWaits'>, r: Reservation, command: Command, trace: Trace): Promise<Answer | undefined> {
  switch (r.kind) {
    case 'proceed': return undefined
    case 'stale': throw staleFenceError(trace.entity!, trace.fence!, r.highest)
    // One answer whether the fence is wrong or the lease is another subject's: a guesser learns nothing of the live fence.
    case 'lease_expired': throw new FencegateError('lease_expired', `fence ${trace.fence} is not the current token of a live lease on ${trace.entity} held by this caller`, { entity: trace.entity!, presented_fence: trace.fence! })
    case 'replay': return replayAnswer(r.stored, trace.requestId)
    case 'reused': throw new FencegateError('idempotency_key_reused', 'this Idempotency-Key was used with a different method, path, query or body')
    case 'not_replayable': throw new FencegateError('response_not_replayable', 'the original response was larger than max_stored_body; it is not executed again')
    case 'outcome_unknown': throw new FencegateError('outcome_unknown', 'the original request may have reached the upstream but its answer was lost; reconcile, then release the key')
    case 'in_progress': return waitForInFlight(ctx, r, command, trace)
  }
}

/** A duplicate of a request in flight: wait up to `idempotency_wait` for its answer (src/gateway/outcome-waits.ts), else refuse with an honest Retry-After. */
async function waitForInFlight(ctx: Pick<PipelineContext, 'store' | 'metrics' | 'outcomeWaits'>, r: Extract<Reservation, { kind: 'in_progress' }>, command: Command, trace: Trace): Promise<Answer | undefined> {
  const rc = trace.route!.config
  const waitStarted = performance.now()
  const waitMs = idempotencyWaitOf(rc)
  if (waitMs > 0) {
    // Woken by this process's own completion, or by the key's one shared poll; false past the
    // wait, or at once when the store's budget of polled keys is spent (answered as a timeout).
    const settled = await ctx.outcomeWaits.wait(command.tenant, command.idempotency!.key, waitMs)
    // The same command again: fence, lease and key are all decided anew.
    if (settled) return answerReservation(ctx, await reserve(ctx, command, trace), command, trace)
  }
  // Retry when the original's own timeout has passed, not when its (longer) lock would.
  const waited = performance.now() - waitStarted
  const ms = inProgressRetryMs({ ageMs: r.ageMs + waited, lockLeftMs: r.retryAfterMs - waited }, rc.timeout_ms)
  throw new FencegateError('request_in_progress', 'the original request is still being processed; retry later', {}, retryAfter(ms))
}
