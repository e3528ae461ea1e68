import { ExportResultCode, W3CTraceContextPropagator } from '@opentelemetry/core'
import { OTLPTraceExporter as JsonTraceExporter } from '@opentelemetry/exporter-trace-otlp-http'
import { OTLPTraceExporter as ProtobufTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto'
import { defaultResource, resourceFromAttributes } from '@opentelemetry/resources'
import {
  AlwaysOffSampler, AlwaysOnSampler, BasicTracerProvider, BatchSpanProcessor, ParentBasedSampler, TraceIdRatioBasedSampler,
  type Sampler, type SpanExporter,
} from '@opentelemetry/sdk-trace-base'
import { ATTR_SERVICE_NAME } from '@opentelemetry/semantic-conventions'
import type { Logger } from '../../observe/log.js'
import { otelTracing } from '../../observe/otel.js'
import { noTracing, type Tracing } from '../../observe/tracing.js'
import type { SamplerSetting, TracingSettings } from './tracing-env.js'

/** The Node runtime's tracing, and how to flush what it holds when the gateway stops. */
export interface NodeTracing {
  tracing: Tracing
  /** Exports the spans ended so far; resolves once the collector answered or the export failed (logged, never thrown). */
  flush(): Promise<void>
  /** Exports the spans still queued (bounded by the export timeout) and stops. */
  shutdown(): Promise<void>
}

function samplerOf(s: SamplerSetting): Sampler {
  switch (s.name) {
    case 'always_on': return new AlwaysOnSampler()
    case 'always_off': return new AlwaysOffSampler()
    case 'traceidratio': return new TraceIdRatioBasedSampler(s.ratio)
    case 'parentbased_always_on': return new ParentBasedSampler({ root: new AlwaysOnSampler() })
    case 'parentbased_always_off': return new ParentBasedSampler({ root: new AlwaysOffSampler() })
    case 'parentbased_traceidratio': return new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(s.ratio) })
  }
}

/**
 * The OTLP/HTTP exporter of the configured protocol. A failed export is logged (how many spans
 * were lost, never their content) and dropped: the SDK exports from its own timer, so a
 * collector that is down or answers 500 never stalls or fails a request.
 */
function exporterOf(settings: TracingSettings, log: Logger): SpanExporter {
  const options = { url: settings.endpoint, headers: settings.headers, timeoutMillis: settings.timeoutMs }
  const inner = settings.protocol === 'http/json' ? new JsonTraceExporter(options) : new ProtobufTraceExporter(options)
  return {
    export(spans, done) {
      inner.export(spans, (result) => {
        if (result.code !== ExportResultCode.SUCCESS) log.warn('trace_export_failed', { spans: spans.length, error: result.error?.name ?? 'error' })
        done(result)
      })
    },
    shutdown: () => inner.shutdown(),
    forceFlush: () => inner.forceFlush(),
  }
}

/**
 * Builds tracing from settings: the SDK's tracer with a batch processor in front of the OTLP
 * exporter and W3C Trace Context. Nothing is registered globally (the process's other
 * OpenTelemetry users are left alone), and no context manager is used: the core passes parents.
 *
 * @example
 * const { tracing, shutdown } = startTracing(settings, log)
 */
export function startTracing(settings: TracingSettings, log: Logger): NodeTracing {
  const resource = defaultResource().merge(resourceFromAttributes({ ...settings.resource, [ATTR_SERVICE_NAME]: settings.serviceName }))
  const provider = new BasicTracerProvider({
    resource,
    sampler: samplerOf(settings.sampler),
    spanProcessors: [new BatchSpanProcessor(exporterOf(settings, log), settings.batch)],
  })
  const tracing = otelTracing({ tracer: provider.getTracer('fencegate'), propagator: new W3CTraceContextPropagator() })
  return {
    tracing,
    // A failed export was logged by the exporter (trace_export_failed); it is no failure of the gateway's.
    flush: () => provider.forceFlush().catch(() => {}),
    async shutdown() {
      await provider.shutdown().catch(() => {})
    },
  }
}

/**
 * The tracing settings ask for (`tracingSettings(process.env)`, src/runtime/node/tracing-env.ts):
 * none when they are undefined, that is, unless `OTEL_TRACES_EXPORTER=otlp`.
 *
 * @example
 * const tracing = nodeTracing(tracingSettings(process.env), log)
 * await startGateway({ config, log, tracing })
 */
export function nodeTracing(settings: TracingSettings | undefined, log: Logger): NodeTracing {
  if (!settings) return { tracing: noTracing, flush: async () => {}, shutdown: async () => {} }
  // The collector's origin only: a path or query may carry a token.
  log.info('tracing', { endpoint: new URL(settings.endpoint).origin, protocol: settings.protocol, sampler: settings.sampler.name, service_name: settings.serviceName })
  return startTracing(settings, log)
}
