import { FencegateError } from '../http/problems.js'
import { storeCode } from '../store/db.js'
import { traceIdOf } from '../observe/tracing.js'
import type { PipelineContext } from './context.js'
import { timed, type Trace } from './trace.js'

/**
 * Runs a step whose client-caused rejections are written to the audit trail, naming the
 * entity whenever the request resolves it. A lost audit row never changes the answer.
 *
 * @example
 * const slot = await audited(ctx, trace, () => takeSlot(ctx.store, slot, wait))
 */
export async function audited<T>(ctx: Pick<PipelineContext, 'store' | 'log'>, trace: Trace, step: () => Promise<T>): Promise<T> {
  try {
    return await step()
  } catch (err) {
    await auditRejection(ctx, trace, err)
    throw err
  }
}

/**
 * Writes a client-caused rejection (a FencegateError below 500) to the audit trail; anything
 * else is left to the caller. For hot steps that catch for themselves: `audited` costs a
 * closure and an async frame per call, on every command, for the rare one that fails.
 *
 * @example
 * try { bytes = await request.readBody(limit) } catch (err) { await auditRejection(ctx, trace, err); throw err }
 */
export async function auditRejection(ctx: Pick<PipelineContext, 'store' | 'log'>, trace: Trace, err: unknown): Promise<void> {
  if (!(err instanceof FencegateError) || err.status >= 500) return
  await timed(trace, 'storeMs', () => ctx.store.recordRejection({
    tenant: trace.identity!.tenant, route: trace.route!.config.name, entity: trace.entity ?? trace.auditEntity?.() ?? null, code: err.code,
    presentedFence: trace.fence ?? null, highestFence: null, method: trace.method, path: trace.path,
    bodySha256: trace.bodySha256 ?? null, caller: trace.identity!.caller, requestId: trace.requestId, idempotencyKey: trace.key ?? null,
    traceId: traceIdOf(trace.span),
  })).catch((auditErr: unknown) => {
    // The client still learns what it got wrong; the lost row is logged by its id.
    ctx.log.error('audit_write_failed', { request_id: trace.requestId, code: err.code, store_code: storeCode(auditErr) })
  })
}
