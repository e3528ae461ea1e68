import { ATTR_DB_OPERATION_NAME, ATTR_DB_RESPONSE_STATUS_CODE, ATTR_DB_SYSTEM_NAME } from '@opentelemetry/semantic-conventions'
import { StoreError } from '../store/db.js'
import type { OpenSpan, Tracing } from './tracing.js'
import { watchCalls } from './watch-calls.js'

/** A failed store call's span: the SQLSTATE (or driver code) as `db.response.status_code` and its type. */
function endFailed(span: OpenSpan, err: unknown): void {
  const code = err instanceof StoreError ? (err.sqlstate ?? err.driverCode) : undefined
  span.set({ [ATTR_DB_RESPONSE_STATUS_CODE]: code })
  span.end(code ?? (err as Error)?.name ?? 'error')
}

/**
 * A store whose calls are CLIENT spans under `parent`, named by the method (`reserve`,
 * `complete`) with `db.system.name` (`postgresql`, or `pglite` for the embedded store) and
 * `db.operation.name`, never a parameter. The one place store spans are written; the pipeline
 * takes one per sampled command, and an unsampled one gets the store itself. `close` and
 * methods that return no promise are passed through.
 *
 * @example
 * const store = storeSpans(ctx.store, trace.span, ctx.tracing, 'postgresql')
 */
export function storeSpans<S extends object>(store: S, parent: OpenSpan, tracing: Tracing, system: string): S {
  if (!parent.sampled) return store
  return watchCalls(store, (call) => {
    const span = tracing.store(parent, call, { [ATTR_DB_SYSTEM_NAME]: system, [ATTR_DB_OPERATION_NAME]: call })
    return span && ((failed, err) => (failed ? endFailed(span, err) : span.end()))
  }, 'settle')
}
