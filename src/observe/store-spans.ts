import { ATTR_DB_OPERATION_NAME, ATTR_DB_RESPONSE_STATUS_CODE, ATTR_DB_SYSTEM_NAME } from '@opentelemetry/semantic-conventions'
import { StoreError } from '../store/db.js'
import type { OpenSpan, Tracing } from './tracing.js'

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
  const wrapped: Record<string, unknown> = {}
  for (const [call, fn] of Object.entries(store)) {
    if (typeof fn !== 'function' || call === 'close') {
      wrapped[call] = fn
      continue
    }
    wrapped[call] = (...args: unknown[]) => {
      const span = tracing.store(parent, call, { [ATTR_DB_SYSTEM_NAME]: system, [ATTR_DB_OPERATION_NAME]: call })
      const result: unknown = (fn as (...a: unknown[]) => unknown)(...args)
      if (!span) return result
      if (!(result instanceof Promise)) {
        span.end()
        return result
      }
      return result.then((value: unknown) => {
        span.end()
        return value
      }, (err: unknown) => {
        endFailed(span, err)
        throw err
      })
    }
  }
  return wrapped as S
}
