import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { createPinoLogger } from '../src/runtime/node/log.js'
import { startTracing, type NodeTracing } from '../src/runtime/node/tracing.js'
import { tracingSettings } from '../src/runtime/node/tracing-env.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { spanKind, startCollector, type Collector, type ReceivedSpan } from './helpers/otlp.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

const traceparentPattern = /^00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])$/

/** The one traceparent the upstream received (fails when there were none or several). */
function upstreamTraceparent(upstream: TestUpstream, index: number): { traceId: string; spanId: string; flags: string } {
  const raw = upstream.received[index]!.rawHeaders
  const values = raw.filter((_v, i) => i % 2 === 1 && raw[i - 1]!.toLowerCase() === 'traceparent')
  expect(values).toHaveLength(1)
  const m = traceparentPattern.exec(values[0]!)
  expect(m).not.toBeNull()
  return { traceId: m![1]!, spanId: m![2]!, flags: m![3]! }
}

const httpClient = (spans: ReceivedSpan[]) => spans.filter((s) => s.kind === spanKind.client && 'http.request.method' in s.attributes)

for (const backend of backends()) {
  for (const protocol of ['http/protobuf', 'http/json'] as const) {
    describe(`traces on ${backend.name} over ${protocol}`, () => {
      let t: TestDb
      let upstream: TestUpstream
      let collector: Collector
      let traced: NodeTracing
      let gw: TestGateway
      let lines: string[]

      beforeEach(async () => {
        t = await backend.open()
        upstream = await startUpstream()
        collector = await startCollector()
        lines = []
        const log = createPinoLogger('info', { write: (line: string) => { lines.push(line) } })
        traced = startTracing(tracingSettings({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: collector.url, OTEL_EXPORTER_OTLP_PROTOCOL: protocol, OTEL_SERVICE_NAME: 'fg-test' })!, log)
        const config = testConfig([route(upstream.url, { idempotency: 'optional' })])
        gw = await startTestGateway({ config, store: t.store, log, tracing: traced.tracing, storeSystem: backend.name === 'postgres' ? 'postgresql' : 'pglite' })
      })
      afterEach(async () => {
        await gw.close()
        await traced.shutdown()
        await collector.close()
        await upstream.close()
        await t.close()
      })

      it('a fenced command is a SERVER span with the store decision and the CLIENT span whose context the upstream received', async () => {
        const res = await post(`${gw.url}/payments/42/capture?amount=10&note=x`, '7', { headers: { 'idempotency-key': 'k-1' } })
        expect(res.status).toBe(200)
        // Every span has ended before the client has the whole answer; the flush resolves once the collector has them.
        await traced.flush()
        const spans = collector.spans
        expect(spans).toHaveLength(4)
        expect(collector.contentTypes[0]).toBe(protocol === 'http/json' ? 'application/json' : 'application/x-protobuf')
        const server = spans.find((s) => s.kind === spanKind.server)!
        expect(server.name).toBe('POST /payments/:invoice_id/capture')
        expect(server.parentSpanId).toBe('')
        expect(server.attributes).toMatchObject({
          'http.request.method': 'POST', 'url.path': '/payments/42/capture', 'http.route': '/payments/:invoice_id/capture',
          'http.response.status_code': 200, 'fencegate.route': 'capture', 'fencegate.decision': 'forwarded',
          'fencegate.fence': '7', 'fencegate.entity': 'invoice:42', 'fencegate.idempotency.outcome': 'reserved',
        })
        expect(server.status.code).toBe(0)
        expect(server.resource['service.name']).toBe('fg-test')
        const store = spans.filter((s) => s.attributes['db.operation.name'] !== undefined)
        expect(store.map((s) => s.name).sort()).toEqual(['complete', 'reserve'])
        for (const s of store) {
          expect(s.kind).toBe(spanKind.client)
          expect(s.parentSpanId).toBe(server.spanId)
          expect(s.traceId).toBe(server.traceId)
          expect(s.attributes['db.system.name']).toBe(backend.name === 'postgres' ? 'postgresql' : 'pglite')
          // Names and the system only: no parameter of the statement.
          expect(Object.keys(s.attributes).sort()).toEqual(['db.operation.name', 'db.system.name'])
        }
        const [client] = httpClient(spans)
        expect(client!.name).toBe('POST')
        expect(client!.parentSpanId).toBe(server.spanId)
        expect(client!.attributes).toMatchObject({
          'http.request.method': 'POST', 'server.address': '127.0.0.1', 'server.port': upstream.port,
          'url.full': `${upstream.url}/payments/42/capture?amount=REDACTED&note=REDACTED`, 'http.response.status_code': 200,
        })
        expect(upstreamTraceparent(upstream, 0)).toEqual({ traceId: server.traceId, spanId: client!.spanId, flags: '01' })
        // The decision's log line carries the trace: trace_id and the SERVER span's id.
        const decision = lines.map((l) => JSON.parse(l)).find((l) => l.event === 'request')
        expect(decision).toMatchObject({ trace_id: server.traceId, span_id: server.spanId, outcome: 'forwarded' })
      })

      it('a stale command shows the refusal and the store decision, and no CLIENT span: nothing went upstream', async () => {
        expect((await post(`${gw.url}/payments/42/capture`, '7')).status).toBe(200)
        const stale = await post(`${gw.url}/payments/42/capture`, '6')
        expect(stale.status).toBe(409)
        await traced.flush()
        const spans = collector.spans
        expect(spans).toHaveLength(5)
        const servers = spans.filter((s) => s.kind === spanKind.server)
        expect(servers).toHaveLength(2)
        const refused = servers.find((s) => s.attributes['fencegate.decision'] === 'stale_fence')!
        expect(refused.attributes).toMatchObject({ 'http.response.status_code': 409, 'fencegate.fence': '6', 'fencegate.entity': 'invoice:42' })
        // A client's mistake is not the server's error: the status stays unset.
        expect(refused.status.code).toBe(0)
        const inRefused = spans.filter((s) => s.traceId === refused.traceId && s !== refused)
        expect(inRefused.map((s) => s.name)).toEqual(['reserve'])
        expect(httpClient(spans)).toHaveLength(1)
        expect(upstream.received).toHaveLength(1)
      })

      it('a replay is answered from the store: its trace has no CLIENT span and the upstream sees nothing', async () => {
        const headers = { 'idempotency-key': 'k-2' }
        expect((await post(`${gw.url}/payments/9/capture`, '1', { headers })).status).toBe(200)
        expect((await post(`${gw.url}/payments/9/capture`, '1', { headers })).status).toBe(200)
        await traced.flush()
        const spans = collector.spans
        expect(spans).toHaveLength(6)
        const replayed = spans.find((s) => s.kind === spanKind.server && s.attributes['fencegate.decision'] === 'replayed')!
        expect(replayed.attributes['fencegate.idempotency.outcome']).toBe('replay')
        expect(spans.filter((s) => s.traceId === replayed.traceId && s !== replayed).map((s) => s.name)).toEqual(['reserve'])
        expect(upstream.received).toHaveLength(1)
      })
    })
  }
}
