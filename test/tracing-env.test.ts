import { describe, expect, it } from 'vitest'
import { ConfigError } from '../src/config/schema.js'
import { tracingSettings } from '../src/runtime/node/tracing-env.js'

const on = { OTEL_TRACES_EXPORTER: 'otlp' }

describe('tracing from the OTEL_* environment variables', () => {
  it('is off unless OTEL_TRACES_EXPORTER=otlp, and off again with OTEL_SDK_DISABLED=true', () => {
    expect(tracingSettings({})).toBeUndefined()
    expect(tracingSettings({ OTEL_TRACES_EXPORTER: 'none' })).toBeUndefined()
    expect(tracingSettings({ OTEL_TRACES_EXPORTER: ' ' })).toBeUndefined()
    expect(tracingSettings({ ...on, OTEL_SDK_DISABLED: 'true' })).toBeUndefined()
    // Off, the other variables are not read: a grpc protocol set for another program of the host does not matter.
    expect(tracingSettings({ OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' })).toBeUndefined()
  })

  it('has the specification\'s defaults, with service.name fencegate and parent-based sampling', () => {
    expect(tracingSettings(on)).toEqual({
      endpoint: 'http://localhost:4318/v1/traces', protocol: 'http/protobuf', headers: {}, timeoutMs: 10000,
      serviceName: 'fencegate', resource: {}, sampler: { name: 'parentbased_always_on' },
      batch: { scheduledDelayMillis: 5000, exportTimeoutMillis: 30000, maxQueueSize: 2048, maxExportBatchSize: 512 },
    })
  })

  it('reads every variable, the signal\'s own winning over the shared one', () => {
    const s = tracingSettings({
      ...on,
      OTEL_EXPORTER_OTLP_ENDPOINT: 'https://collector.example:4318/',
      OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json',
      OTEL_EXPORTER_OTLP_HEADERS: 'x-team=payments,authorization=Bearer%20abc',
      OTEL_EXPORTER_OTLP_TRACES_HEADERS: 'x-team=fencing',
      OTEL_EXPORTER_OTLP_TIMEOUT: '2500',
      OTEL_RESOURCE_ATTRIBUTES: 'deployment.environment.name=prod,service.name=from-resource',
      OTEL_TRACES_SAMPLER: 'parentbased_traceidratio',
      OTEL_TRACES_SAMPLER_ARG: '0.01',
      OTEL_BSP_SCHEDULE_DELAY: '200', OTEL_BSP_EXPORT_TIMEOUT: '1000', OTEL_BSP_MAX_QUEUE_SIZE: '100', OTEL_BSP_MAX_EXPORT_BATCH_SIZE: '50',
    })!
    expect(s.endpoint).toBe('https://collector.example:4318/v1/traces')
    expect(s.protocol).toBe('http/json')
    expect(s.headers).toEqual({ 'x-team': 'fencing', authorization: 'Bearer abc' })
    expect(s.timeoutMs).toBe(2500)
    expect(s.serviceName).toBe('from-resource')
    expect(s.resource).toEqual({ 'deployment.environment.name': 'prod', 'service.name': 'from-resource' })
    expect(s.sampler).toEqual({ name: 'parentbased_traceidratio', ratio: 0.01 })
    expect(s.batch).toEqual({ scheduledDelayMillis: 200, exportTimeoutMillis: 1000, maxQueueSize: 100, maxExportBatchSize: 50 })
    expect(tracingSettings({ ...on, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://c:4318/custom', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://other' })!.endpoint).toBe('http://c:4318/custom')
    expect(tracingSettings({ ...on, OTEL_SERVICE_NAME: 'gw', OTEL_RESOURCE_ATTRIBUTES: 'service.name=x' })!.serviceName).toBe('gw')
  })

  it.each([
    ['OTEL_TRACES_EXPORTER', { OTEL_TRACES_EXPORTER: 'jaeger' }],
    ['OTEL_SDK_DISABLED', { ...on, OTEL_SDK_DISABLED: 'yes' }],
    ['OTEL_EXPORTER_OTLP_PROTOCOL', { ...on, OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc' }],
    ['OTEL_EXPORTER_OTLP_TRACES_PROTOCOL', { ...on, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: 'http/xml' }],
    ['OTEL_EXPORTER_OTLP_ENDPOINT', { ...on, OTEL_EXPORTER_OTLP_ENDPOINT: 'collector:4318' }],
    ['OTEL_EXPORTER_OTLP_TRACES_ENDPOINT', { ...on, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'ftp://c/v1/traces' }],
    ['OTEL_EXPORTER_OTLP_HEADERS', { ...on, OTEL_EXPORTER_OTLP_HEADERS: 'novalue' }],
    ['OTEL_EXPORTER_OTLP_HEADERS', { ...on, OTEL_EXPORTER_OTLP_HEADERS: 'a=%E0%A4%A' }],
    ['OTEL_RESOURCE_ATTRIBUTES', { ...on, OTEL_RESOURCE_ATTRIBUTES: '=x' }],
    ['OTEL_TRACES_SAMPLER', { ...on, OTEL_TRACES_SAMPLER: 'jaeger_remote' }],
    ['OTEL_TRACES_SAMPLER_ARG', { ...on, OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: '1.5' }],
    ['OTEL_TRACES_SAMPLER_ARG', { ...on, OTEL_TRACES_SAMPLER: 'traceidratio', OTEL_TRACES_SAMPLER_ARG: 'half' }],
    ['OTEL_BSP_SCHEDULE_DELAY', { ...on, OTEL_BSP_SCHEDULE_DELAY: '-1' }],
    ['OTEL_BSP_MAX_QUEUE_SIZE', { ...on, OTEL_BSP_MAX_QUEUE_SIZE: '0' }],
    ['OTEL_BSP_MAX_EXPORT_BATCH_SIZE', { ...on, OTEL_BSP_MAX_QUEUE_SIZE: '10', OTEL_BSP_MAX_EXPORT_BATCH_SIZE: '11' }],
    ['OTEL_EXPORTER_OTLP_TIMEOUT', { ...on, OTEL_EXPORTER_OTLP_TIMEOUT: '5s' }],
  ])('refuses a value it cannot use, naming %s', (name, env) => {
    let error: unknown
    try {
      tracingSettings(env)
    } catch (err) {
      error = err
    }
    expect(error).toBeInstanceOf(ConfigError)
    expect((error as ConfigError).message).toContain(`${name}:`)
  })
})
