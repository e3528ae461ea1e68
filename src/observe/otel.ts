import {
  ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, TraceFlags,
  type Context, type ContextManager, type Span, type TextMapGetter, type TextMapPropagator, type TextMapSetter, type Tracer,
} from '@opentelemetry/api'
import { ATTR_ERROR_TYPE } from '@opentelemetry/semantic-conventions'
import type { HeaderView } from '../http/exchange.js'
import type { HeaderSink, OpenSpan, SpanAttributes, Tracing } from './tracing.js'

/** What the OpenTelemetry tracing is built from; each runtime makes its own (src/runtime/node/tracing.ts). */
export interface OtelParts {
  tracer: Tracer
  /** Carries the active span across awaits. Held here rather than registered globally, so that two gateways in one process (tests) keep apart. */
  contexts: ContextManager
  /** W3C Trace Context: reads the caller's `traceparent`, writes the upstream's. */
  propagator: TextMapPropagator
}

const fromHeaders: TextMapGetter<HeaderView> = {
  get: (carrier, key) => carrier.get(key) ?? undefined,
  keys: (carrier) => {
    const names: string[] = []
    carrier.forEach((_value, name) => names.push(name))
    return names
  },
}

const intoHeaders: TextMapSetter<HeaderSink> = { set: (carrier, key, value) => carrier.set(key, value) }

/** An OpenTelemetry span behind the core's `OpenSpan`, with the context it is active in. */
class OtelSpan implements OpenSpan {
  constructor(readonly span: Span, readonly context: Context) {}
  set(attributes: SpanAttributes): void {
    for (const key in attributes) {
      const value = attributes[key]
      if (value !== undefined) this.span.setAttribute(key, value)
    }
  }
  rename(name: string): void {
    this.span.updateName(name)
  }
  end(error?: string): void {
    if (error !== undefined) {
      this.span.setAttribute(ATTR_ERROR_TYPE, error)
      this.span.setStatus({ code: SpanStatusCode.ERROR, message: error })
    }
    this.span.end()
  }
}

function defined(attributes: SpanAttributes): Record<string, string | number | boolean> {
  const out: Record<string, string | number | boolean> = {}
  for (const key in attributes) {
    const value = attributes[key]
    if (value !== undefined) out[key] = value
  }
  return out
}

/**
 * The tracing seam on the OpenTelemetry API: spans from the given tracer, the active one kept by
 * the given context manager, trace context read and written by the given propagator. Nothing
 * here is global; runtime-neutral, so any runtime with a context manager can use it.
 *
 * @example
 * const tracing = otelTracing({ tracer: provider.getTracer('fencegate'), contexts: new AsyncLocalStorageContextManager().enable(), propagator: new W3CTraceContextPropagator() })
 */
export function otelTracing(parts: OtelParts): Tracing {
  const { tracer, contexts, propagator } = parts
  const child = (kind: SpanKind, name: string, attributes: SpanAttributes): OtelSpan => {
    const parent = contexts.active()
    const span = tracer.startSpan(name, { kind, attributes: defined(attributes) }, parent)
    return new OtelSpan(span, trace.setSpan(parent, span))
  }
  return {
    enabled: true,
    server(name, headers, attributes) {
      // An invalid or absent traceparent extracts nothing: the request starts a trace of its own.
      const parent = propagator.extract(ROOT_CONTEXT, headers, fromHeaders)
      const span = tracer.startSpan(name, { kind: SpanKind.SERVER, attributes: defined(attributes) }, parent)
      return new OtelSpan(span, trace.setSpan(parent, span))
    },
    within(span, fn) {
      return span instanceof OtelSpan ? contexts.with(span.context, fn) : fn()
    },
    bind(fn) {
      return contexts.bind(contexts.active(), fn)
    },
    client(name, attributes, headers) {
      const span = child(SpanKind.CLIENT, name, attributes)
      // Exactly one traceparent reaches the upstream: this span's, never the caller's as sent.
      headers.delete('traceparent')
      headers.delete('tracestate')
      propagator.inject(span.context, headers, intoHeaders)
      return span
    },
    store(name, attributes) {
      // Store calls outside a sampled request (the purge, gauges) are not traced: they would each be a trace of one span.
      // Sampled, not recording: a streamed answer's completion is written after its request's span ended.
      const parent = trace.getSpan(contexts.active())?.spanContext()
      if (!parent || (parent.traceFlags & TraceFlags.SAMPLED) === 0) return undefined
      return child(SpanKind.CLIENT, name, attributes)
    },
    activeIds() {
      const span = trace.getSpan(contexts.active())
      if (!span) return undefined
      const { traceId, spanId } = span.spanContext()
      return { trace_id: traceId, span_id: spanId }
    },
  }
}
