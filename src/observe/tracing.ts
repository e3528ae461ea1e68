import type { HeaderView } from '../http/exchange.js'
import type { LogFields, Logger } from './log.js'

/** A span attribute's value; `undefined` leaves the attribute out. */
export type SpanValue = string | number | boolean | undefined
export type SpanAttributes = Record<string, SpanValue>

/** One span the core opened: attributes go on while it runs, then it ends once. */
export interface OpenSpan {
  /** Its trace and span id, for log lines; undefined for the no-op span. */
  readonly ids: { trace_id: string; span_id: string } | undefined
  /** Whether its trace is sampled: only then are children (store calls) made at all. */
  readonly sampled: boolean
  /**
   * Whether its trace id is the caller's: a SERVER span that continued a valid `traceparent`
   * (the caller chose the id, and with a `parentbased_*` sampler whether it is sampled). False
   * when the gateway started the trace, and for the no-op span.
   */
  readonly callerTrace: boolean
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
 * so tracing that is off costs a few calls of empty functions per request. Parents are passed,
 * not found in an ambient context: on Node 20 an AsyncLocalStorage makes every promise of the
 * process slower, traced or not.
 */
export interface Tracing {
  /** False for `noTracing`: callers skip building attributes nobody records. */
  readonly enabled: boolean
  /** Starts the SERVER span of an inbound request, continuing the caller's `traceparent` when it is valid. */
  server(name: string, headers: HeaderView, attributes: SpanAttributes): OpenSpan
  /**
   * Starts a CLIENT span under `parent` and writes its context into `headers` as W3C
   * `traceparent` and `tracestate`, replacing any the caller sent (also when it is not sampled:
   * the upstream still joins the trace).
   */
  client(parent: OpenSpan, name: string, attributes: SpanAttributes, headers: HeaderSink): OpenSpan
  /** A CLIENT span for a store call under `parent`; undefined when `parent` is not sampled. */
  store(parent: OpenSpan, name: string, attributes: SpanAttributes): OpenSpan | undefined
}

const noSpan: OpenSpan = { ids: undefined, sampled: false, callerTrace: false, set() {}, rename() {}, end() {} }

/**
 * Tracing that records nothing: the default wherever none is injected (and the Workers runtime's).
 *
 * @example
 * const plane = createDataPlane({ config, store, forward, tracing: noTracing })
 */
export const noTracing: Tracing = {
  enabled: false,
  server: () => noSpan,
  client: () => noSpan,
  store: () => undefined,
}

/**
 * How a trace id the caller chose is marked on its way to an audit row. The store splits the
 * mark off into `fg_audit.trace_from_caller` as the row is inserted (migration 0020), so every
 * statement that audits passes one text value through unchanged.
 */
export const callerTraceMark = 'caller:'

/**
 * The trace id an audit row records for a request: its span's, sampled or not (its log lines
 * and the upstream's `traceparent` carry it either way), marked `caller:` when it came from the
 * caller's `traceparent` rather than from the gateway; null when tracing is off.
 *
 * @example
 * await store.bumpFence({ tenant, entity, minFence, caller, requestId, traceId: traceIdOf(span) })
 * traceIdOf(span) // 'caller:4bf92f3577b34da6a3ce929d0e0e4736' after `traceparent: 00-4bf9…-…-01`
 */
export function traceIdOf(span: OpenSpan | undefined): string | null {
  const id = span?.ids?.trace_id
  if (id === undefined) return null
  return span!.callerTrace ? callerTraceMark + id : id
}

/**
 * A logger whose lines carry the span's `trace_id` and `span_id`: one wrapper per traced
 * request for every line written while it is handled, rather than a field at each call.
 * Without ids (tracing off) it is the logger itself.
 *
 * @example
 * const log = correlatedLogger(ctx.log, trace.span)
 */
export function correlatedLogger(log: Logger, span: OpenSpan): Logger {
  const ids = span.ids
  if (!ids) return log
  const at = (level: keyof Logger) => (event: string, fields?: LogFields) => log[level](event, { ...fields, ...ids })
  return { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') }
}
