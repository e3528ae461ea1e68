import type { HeaderView } from '../http/exchange.js'
import type { LogFields, Logger } from './log.js'

/** A span attribute's value; `undefined` leaves the attribute out. */
export type SpanValue = string | number | boolean | undefined
export type SpanAttributes = Record<string, SpanValue>

/** One span the core opened: attributes go on while it runs, then it ends once. */
export interface OpenSpan {
  /** Adds attributes (an `undefined` value is left out). */
  set(attributes: SpanAttributes): void
  /** Renames it: a SERVER span learns its route template only after routing. */
  rename(name: string): void
  /** Ends it; with `error`, its status is ERROR and `error` (a type, never a message with data) says why. */
  end(error?: string): void
}

/** The header list the CLIENT span's context is written into (`traceparent`, `tracestate`). */
export interface HeaderSink {
  set(name: string, value: string): void
  delete(name: string): void
}

/**
 * The tracing seam: what the core asks of a tracer, and nothing more. Each runtime decides
 * what it becomes (the OpenTelemetry SDK on Node when `OTEL_TRACES_EXPORTER=otlp`,
 * src/runtime/node/tracing.ts); the default, `noTracing`, does nothing and allocates nothing,
 * so tracing that is off costs a few calls of empty functions per request.
 */
export interface Tracing {
  /** False for `noTracing`: callers may skip building attributes nobody records. */
  readonly enabled: boolean
  /** Starts the SERVER span of an inbound request, continuing the caller's `traceparent` when it is valid. */
  server(name: string, headers: HeaderView, attributes: SpanAttributes): OpenSpan
  /** Runs `fn` with `span` active: the store calls and log lines made inside belong to it. */
  within<T>(span: OpenSpan, fn: () => T): T
  /** `fn`, to run later (a stream's callback) with the span active now: its store calls still belong to the request. */
  bind<F extends (...args: never[]) => unknown>(fn: F): F
  /**
   * Starts a CLIENT span under the active span and writes its context into `headers` as W3C
   * `traceparent` and `tracestate`, replacing any the caller sent (also when it is not sampled:
   * the upstream still joins the trace).
   */
  client(name: string, attributes: SpanAttributes, headers: HeaderSink): OpenSpan
  /** A CLIENT span for a store call under the active span; undefined when no sampled span is active. */
  store(name: string, attributes: SpanAttributes): OpenSpan | undefined
  /** The active span's ids, for log lines; undefined outside a traced request. */
  activeIds(): { trace_id: string; span_id: string } | undefined
}

const noSpan: OpenSpan = { set() {}, rename() {}, end() {} }

/**
 * Tracing that records nothing: the default wherever none is injected (and the Workers runtime's).
 *
 * @example
 * const plane = createDataPlane({ config, store, forward, tracing: noTracing })
 */
export const noTracing: Tracing = {
  enabled: false,
  server: () => noSpan,
  within: (_span, fn) => fn(),
  bind: (fn) => fn,
  client: () => noSpan,
  store: () => undefined,
  activeIds: () => undefined,
}

/**
 * A logger whose lines, written while a traced request is active, carry its `trace_id` and
 * `span_id`: one wrapper for every line of the data plane rather than a field at each call.
 * Without tracing it is the logger itself.
 *
 * @example
 * const log = correlatedLogger(createLogger('info'), tracing)
 */
export function correlatedLogger(log: Logger, tracing: Tracing): Logger {
  if (!tracing.enabled) return log
  const at = (level: keyof Logger) => (event: string, fields?: LogFields) => {
    const ids = tracing.activeIds()
    log[level](event, ids ? { ...fields, ...ids } : fields)
  }
  return { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') }
}
