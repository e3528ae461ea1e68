import { context, propagation, trace } from '@opentelemetry/api'
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks'
import { W3CTraceContextPropagator } from '@opentelemetry/core'
import { BasicTracerProvider } from '@opentelemetry/sdk-trace-base'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { JobApi } from '../src/client/http.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

// The worker's side: the SDK's calls carry the worker's active trace when its process has an
// OpenTelemetry SDK registered, and nothing when it has none (the tests run in this order).
describe('the worker SDK and OpenTelemetry', () => {
  let gateway: TestUpstream
  beforeAll(async () => {
    gateway = await startUpstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
    })
  })
  afterAll(async () => {
    trace.disable()
    propagation.disable()
    context.disable()
    await gateway.close()
  })

  it('without an SDK registered sends no traceparent, and works as before', async () => {
    const api = new JobApi(gateway.url, 'token', (input, init) => fetch(input, init))
    expect((await api.call('GET', '/1', undefined, 5000)).status).toBe(200)
    expect(gateway.received[0]!.headers.traceparent).toBeUndefined()
  })

  it("with one, sends the active span's context, and keeps a traceparent the caller set", async () => {
    context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable())
    propagation.setGlobalPropagator(new W3CTraceContextPropagator())
    trace.setGlobalTracerProvider(new BasicTracerProvider())
    const api = new JobApi(gateway.url, 'token', (input, init) => fetch(input, init))
    const ids = await trace.getTracer('worker').startActiveSpan('work', async (span) => {
      await api.call('POST', '/claim', { types: ['sync'] }, 5000)
      const headers = new Headers({ traceparent: `00-${'1'.repeat(32)}-${'2'.repeat(16)}-01` })
      api.authorize(`${gateway.url}/payments/1`, headers)
      expect(headers.get('traceparent')).toBe(`00-${'1'.repeat(32)}-${'2'.repeat(16)}-01`)
      span.end()
      return span.spanContext()
    })
    expect(gateway.received[1]!.headers.traceparent).toBe(`00-${ids.traceId}-${ids.spanId}-01`)
  })
})
