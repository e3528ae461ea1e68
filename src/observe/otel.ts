import {
  ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, TraceFlags,
  type Attributes, type Context, type Span, type TextMapGetter, type TextMapPropagator, type TextMapSetter, type Tracer,
} from '@opentelemetry/api'
import { ATTR_ERROR_TYPE } from '@opentelemetry/semantic-conventions'
import type { HeaderView } from '../http/exchange.js'
import type { HeaderSink, OpenSpan, SpanAttributes, Tracing } from './tracing.js'

/** What the OpenTelemetry tracing is built from; each runtime makes its own (src/runtime/node/tracing.ts). */
export interface OtelParts {
  tracer: Tracer
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

/**
 * An OpenTelemetry span behind the core's `OpenSpan`. The context its children start in is
 * made when a child asks for it (a Context is a copied map): a store span never has children.
 */
class OtelSpan implements OpenSpan {
  readonly sampled: boolean
  private childContext: Context | undefined
  constructor(readonly span: Span, private readonly parent: Context, readonly callerTrace = false) {
    this.sampled = (span.spanContext().traceFlags & TraceFlags.SAMPLED) !== 0
  }
  get context(): Context {
    return (this.childContext ??= trace.setSpan(this.parent, this.span))
  }
  get ids() {
    const { traceId, spanId } = this.span.spanContext()
    return { trace_id: traceId, span_id: spanId }
  }
  set(attributes: SpanAttributes): void {
    // The SDK leaves out an undefined (or null) value, as the seam promises.
    this.span.setAttributes(attributes as Attributes)
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

const contextOf = (parent: OpenSpan): Context => (parent instanceof OtelSpan ? parent.context : ROOT_CONTEXT)

/**
 * The tracing seam on the OpenTelemetry API: spans from the given tracer, trace context read and
 * written by the given propagator, each child started from the parent it is given. Nothing here
 * is global and no context manager is needed; runtime-neutral.
 *
 * @example
 * const tracing = otelTracing({ tracer: provider.getTracer('fencegate'), propagator: new W3CTraceContextPropagator() })
 */
export function otelTracing(parts: OtelParts): Tracing {
  const { tracer, propagator } = parts
  // Attributes go on after the sampling decision, only on a span that records: an unsampled
  // one (most of them at a low ratio) then costs no copy of them. Our samplers read none.
  const started = (name: string, kind: SpanKind, attributes: SpanAttributes, context: Context): Span => {
    const span = tracer.startSpan(name, { kind }, context)
    // The SDK leaves out an undefined value.
    if (span.isRecording()) span.setAttributes(attributes as Attributes)
    return span
  }
  const child = (parent: OpenSpan, kind: SpanKind, name: string, attributes: SpanAttributes): OtelSpan => {
    const context = contextOf(parent)
    return new OtelSpan(started(name, kind, attributes, context), context)
  }
  return {
    enabled: true,
    server(name, headers, attributes) {
      // An invalid or absent traceparent extracts nothing: the request starts a trace of its own.
      const parent = propagator.extract(ROOT_CONTEXT, headers, fromHeaders)
      const span = started(name, SpanKind.SERVER, attributes, parent)
      // The caller's trace id when the span continued its traceparent (one the SDK found invalid,
      // such as all zeros, made it start a trace of its own).
      const fromCaller = trace.getSpanContext(parent)?.traceId === span.spanContext().traceId
      return new OtelSpan(span, parent, fromCaller)
    },
    client(parent, name, attributes, headers) {
      const span = child(parent, SpanKind.CLIENT, name, attributes)
      // Exactly one traceparent reaches the upstream: this span's, never the caller's as sent.
      headers.delete('traceparent')
      headers.delete('tracestate')
      propagator.inject(span.context, headers, intoHeaders)
      return span
    },
    store(parent, name, attributes) {
      // Sampled, not recording: a streamed answer's completion is written after its request's span ended.
      return parent.sampled ? child(parent, SpanKind.CLIENT, name, attributes) : undefined
    },
  }
}
