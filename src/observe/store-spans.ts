import { ATTR_DB_OPERATION_NAME, ATTR_DB_RESPONSE_STATUS_CODE, ATTR_DB_SYSTEM_NAME } from '@opentelemetry/semantic-conventions'
import { StoreError } from '../store/db.js'
import type { OpenSpan, SpanAttributes, Tracing } from './tracing.js'

/** A failed store call's span: the SQLSTATE (or driver code) as `db.response.status_code` and its type. */
function endFailed(span: OpenSpan, err: unknown): void {
  const code = err instanceof StoreError ? (err.sqlstate ?? err.driverCode) : undefined
  span.set({ [ATTR_DB_RESPONSE_STATUS_CODE]: code })
  span.end(code ?? (err as Error)?.name ?? 'error')
}

// A symbol, so no store method's name can be shadowed by it.
const parentKey = Symbol('parent span')

/** What a traced store's methods read of the object they are called on: the command's span. */
interface Traced {
  [parentKey]: OpenSpan
}

type Method = (...args: unknown[]) => unknown

/** Runs a store call inside a span of its own, ended when its promise settles. */
function spanned(tracing: Tracing, call: string, attributes: SpanAttributes, fn: Method): (this: Traced, ...args: unknown[]) => unknown {
  return function (this: Traced, ...args: unknown[]) {
    const span = tracing.store(this[parentKey], call, attributes)
    const result = fn(...args)
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

// Per store object (and tracing and system, fixed with it), its traced methods, built once:
// a command then costs one small object whose prototype they are, not a copy of every method.
const prototypes = new WeakMap<object, { tracing: Tracing; system: string; proto: object }>()

function prototypeOf(store: object, tracing: Tracing, system: string): object {
  const known = prototypes.get(store)
  if (known && known.tracing === tracing && known.system === system) return known.proto
  const proto: Record<string, unknown> = {}
  for (const [call, fn] of Object.entries(store)) {
    // The attributes are the same for every call of a method: one object, copied by the SDK.
    const attributes = { [ATTR_DB_SYSTEM_NAME]: system, [ATTR_DB_OPERATION_NAME]: call }
    proto[call] = typeof fn !== 'function' || call === 'close' ? fn : spanned(tracing, call, attributes, fn as Method)
  }
  prototypes.set(store, { tracing, system, proto })
  return proto
}

/**
 * A store whose calls are CLIENT spans under `parent`, named by the method (`reserve`,
 * `complete`) with `db.system.name` (`postgresql`, or `pglite` for the embedded store) and
 * `db.operation.name`, never a parameter. The one place store spans are written; the pipeline
 * takes one per sampled command, and an unsampled one gets the store itself. `close` and
 * non-functions are passed through; a method that returns no promise is not a statement, and
 * its span ends at once.
 *
 * @example
 * const store = storeSpans(ctx.store, trace.span, ctx.tracing, 'postgresql')
 */
export function storeSpans<S extends object>(store: S, parent: OpenSpan, tracing: Tracing, system: string): S {
  if (!parent.sampled) return store
  const traced = Object.create(prototypeOf(store, tracing, system)) as Traced
  traced[parentKey] = parent
  return traced as unknown as S
}
