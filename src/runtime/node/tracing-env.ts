import { ConfigError } from '../../config/schema.js'

/** Which sampler: the OpenTelemetry names of `OTEL_TRACES_SAMPLER`, and the ratio of those that take one. */
export type SamplerSetting =
  | { name: 'always_on' | 'always_off' | 'parentbased_always_on' | 'parentbased_always_off' }
  | { name: 'traceidratio' | 'parentbased_traceidratio'; ratio: number }

/** Tracing as the `OTEL_*` environment variables ask for it; `undefined` when it is off. */
export interface TracingSettings {
  endpoint: string
  protocol: 'http/protobuf' | 'http/json'
  headers: Record<string, string>
  timeoutMs: number
  serviceName: string
  resource: Record<string, string>
  sampler: SamplerSetting
  batch: { scheduledDelayMillis: number; exportTimeoutMillis: number; maxQueueSize: number; maxExportBatchSize: number }
}

type Env = Record<string, string | undefined>

const samplers = ['always_on', 'always_off', 'traceidratio', 'parentbased_always_on', 'parentbased_always_off', 'parentbased_traceidratio'] as const

/** An environment variable's value, or undefined when it is unset or blank (the specification treats both as unset). */
function read(env: Env, name: string): string | undefined {
  const value = env[name]?.trim()
  return value === undefined || value === '' ? undefined : value
}

function fail(name: string, message: string): never {
  throw new ConfigError([`${name}: ${message}`])
}

/** `key=value,key=value` with percent-encoded values (W3C Baggage's form), as OTEL_RESOURCE_ATTRIBUTES and OTEL_EXPORTER_OTLP_HEADERS take it. */
function keyValues(env: Env, name: string): Record<string, string> {
  const text = read(env, name)
  const out: Record<string, string> = {}
  if (text === undefined) return out
  for (const pair of text.split(',')) {
    const eq = pair.indexOf('=')
    const key = eq < 0 ? '' : pair.slice(0, eq).trim()
    if (key === '') fail(name, `expected key=value pairs separated by commas, got ${JSON.stringify(pair.trim())}`)
    try {
      out[key] = decodeURIComponent(pair.slice(eq + 1).trim())
    } catch {
      fail(name, `the value of ${key} is not valid percent-encoding`)
    }
  }
  return out
}

function wholeNumber(env: Env, name: string, fallback: number, min: number): number {
  const text = read(env, name)
  if (text === undefined) return fallback
  if (!/^\d{1,9}$/.test(text) || Number(text) < min) fail(name, `expected a whole number of at least ${min}, got ${JSON.stringify(text)}`)
  return Number(text)
}

function endpointOf(env: Env): string {
  const traces = read(env, 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT')
  // The signal's own endpoint is used as it is; the shared one gets the signal's path appended.
  const [name, url] = traces !== undefined ? ['OTEL_EXPORTER_OTLP_TRACES_ENDPOINT', traces] : ['OTEL_EXPORTER_OTLP_ENDPOINT', `${(read(env, 'OTEL_EXPORTER_OTLP_ENDPOINT') ?? 'http://localhost:4318').replace(/\/+$/, '')}/v1/traces`]
  let parsed: URL
  try {
    parsed = new URL(url)
  } catch {
    fail(name, `expected an http or https URL, got ${JSON.stringify(url)}`)
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') fail(name, `expected an http or https URL, got ${JSON.stringify(url)}`)
  return url
}

function protocolOf(env: Env): TracingSettings['protocol'] {
  const name = read(env, 'OTEL_EXPORTER_OTLP_TRACES_PROTOCOL') !== undefined ? 'OTEL_EXPORTER_OTLP_TRACES_PROTOCOL' : 'OTEL_EXPORTER_OTLP_PROTOCOL'
  const value = read(env, name) ?? 'http/protobuf'
  if (value !== 'http/protobuf' && value !== 'http/json') fail(name, `expected http/protobuf or http/json (grpc is not supported), got ${JSON.stringify(value)}`)
  return value
}

function samplerOf(env: Env): SamplerSetting {
  const name = read(env, 'OTEL_TRACES_SAMPLER') ?? 'parentbased_always_on'
  if (!(samplers as readonly string[]).includes(name)) fail('OTEL_TRACES_SAMPLER', `expected one of ${samplers.join(', ')}, got ${JSON.stringify(name)}`)
  if (name !== 'traceidratio' && name !== 'parentbased_traceidratio') return { name: name as Exclude<SamplerSetting['name'], 'traceidratio' | 'parentbased_traceidratio'> }
  const arg = read(env, 'OTEL_TRACES_SAMPLER_ARG') ?? '1.0'
  const ratio = /^(?:0|1|0?\.\d+|[01]\.\d*)$/.test(arg) ? Number(arg) : NaN
  if (!(ratio >= 0 && ratio <= 1)) fail('OTEL_TRACES_SAMPLER_ARG', `expected a ratio from 0 to 1 for ${name}, got ${JSON.stringify(arg)}`)
  return { name, ratio }
}

function batchOf(env: Env): TracingSettings['batch'] {
  const maxQueueSize = wholeNumber(env, 'OTEL_BSP_MAX_QUEUE_SIZE', 2048, 1)
  const maxExportBatchSize = wholeNumber(env, 'OTEL_BSP_MAX_EXPORT_BATCH_SIZE', 512, 1)
  if (maxExportBatchSize > maxQueueSize) fail('OTEL_BSP_MAX_EXPORT_BATCH_SIZE', `must not exceed OTEL_BSP_MAX_QUEUE_SIZE (${maxQueueSize}), got ${maxExportBatchSize}`)
  return {
    scheduledDelayMillis: wholeNumber(env, 'OTEL_BSP_SCHEDULE_DELAY', 5000, 0),
    exportTimeoutMillis: wholeNumber(env, 'OTEL_BSP_EXPORT_TIMEOUT', 30000, 1),
    maxQueueSize,
    maxExportBatchSize,
  }
}

/**
 * Reads tracing from the standard OpenTelemetry environment variables, once, at start: off
 * unless `OTEL_TRACES_EXPORTER=otlp` (and `OTEL_SDK_DISABLED` is not `true`). When it is on, a
 * value fencegate does not support fails with a ConfigError naming the variable, rather than
 * being ignored as the SDK would.
 *
 * @example
 * const settings = tracingSettings(process.env) // undefined: tracing is off
 */
export function tracingSettings(env: Env): TracingSettings | undefined {
  const disabled = read(env, 'OTEL_SDK_DISABLED')
  if (disabled !== undefined && disabled !== 'true' && disabled !== 'false') fail('OTEL_SDK_DISABLED', `expected true or false, got ${JSON.stringify(disabled)}`)
  const exporter = read(env, 'OTEL_TRACES_EXPORTER') ?? 'none'
  if (exporter !== 'otlp' && exporter !== 'none') fail('OTEL_TRACES_EXPORTER', `expected otlp or none, got ${JSON.stringify(exporter)}`)
  // The other variables are read only when tracing is on: ones set for other programs of the host (a grpc protocol) must not stop a gateway that does not trace.
  if (exporter !== 'otlp' || disabled === 'true') return undefined
  return {
    endpoint: endpointOf(env),
    protocol: protocolOf(env),
    // The signal's own headers add to (and override) the shared ones, as the specification says.
    headers: { ...keyValues(env, 'OTEL_EXPORTER_OTLP_HEADERS'), ...keyValues(env, 'OTEL_EXPORTER_OTLP_TRACES_HEADERS') },
    timeoutMs: wholeNumber(env, 'OTEL_EXPORTER_OTLP_TRACES_TIMEOUT', wholeNumber(env, 'OTEL_EXPORTER_OTLP_TIMEOUT', 10000, 1), 1),
    serviceName: read(env, 'OTEL_SERVICE_NAME') ?? keyValues(env, 'OTEL_RESOURCE_ATTRIBUTES')['service.name'] ?? 'fencegate',
    resource: keyValues(env, 'OTEL_RESOURCE_ATTRIBUTES'),
    sampler: samplerOf(env),
    batch: batchOf(env),
  }
}
