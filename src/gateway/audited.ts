import { FencegateError } from '../http/problems.js'
import { storeCode } from '../store/db.js'
import type { PipelineContext } from './context.js'
import { timed, type Trace } from './trace.js'

/**
 * Runs a step whose client-caused rejections are written to the audit trail, naming the
 * entity whenever the request resolves it. A lost audit row never changes the answer.
 */
export async function audited<T>(ctx: Pick<PipelineContext, 'store' | 'log'>, trace: Trace, step: () => Promise<T>): Promise<T> {
  try {
    return await step()
  } catch (err) {
    if (err instanceof FencegateError && err.status < 500) {
      await timed(trace, 'storeMs', () => ctx.store.recordRejection({
        tenant: trace.identity!.tenant, route: trace.route!.config.name, entity: trace.entity ?? trace.auditEntity?.() ?? null, code: err.code,
        presentedFence: trace.fence ?? null, highestFence: null, method: trace.method, path: trace.path,
        bodySha256: trace.bodySha256 ?? null, caller: trace.identity!.caller, requestId: trace.requestId, idempotencyKey: trace.key ?? null,
      })).catch((auditErr: unknown) => {
        // The client still learns what it got wrong; the lost row is logged by its id.
        ctx.log.error('audit_write_failed', { request_id: trace.requestId, code: err.code, store_code: storeCode(auditErr) })
      })
    }
    throw err
  }
}
