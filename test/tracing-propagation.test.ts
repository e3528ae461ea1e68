import { afterEach, describe, expect, it } from 'vitest'
import { createPinoLogger } from '../src/runtime/node/log.js'
import { startTracing, type NodeTracing } from '../src/runtime/node/tracing.js'
import { tracingSettings } from '../src/runtime/node/tracing-env.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, rawPost, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { spanKind, startCollector, type Collector } from './helpers/otlp.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

const backend = backends()[0]!
const traceId = '4bf92f3577b34da6a3ce929d0e0e4736'
const callerSpan = '00f067aa0ba902b7'

interface Setup {
  t: TestDb
  upstream: TestUpstream
  collector: Collector
  traced: NodeTracing
  gw: TestGateway
  lines: string[]
}

let open: Setup | undefined

/** A traced gateway on a fresh database, its collector and upstream; `env` adds to the OTEL_* variables. */
async function setup(env: Record<string, string> = {}, upstreamUrl?: string, extra: Record<string, unknown> = {}): Promise<Setup> {
  const t = await backend.open()
  const upstream = await startUpstream()
  const collector = await startCollector()
  const lines: string[] = []
  const log = createPinoLogger('info', { write: (line: string) => { lines.push(line) } })
  const traced = startTracing(tracingSettings({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: collector.url, ...env })!, log)
  const gw = await startTestGateway({ config: testConfig([route(upstreamUrl ?? upstream.url)], extra), store: t.store, log, tracing: traced.tracing, storeSystem: 'pglite' })
  open = { t, upstream, collector, traced, gw, lines }
  return open
}

afterEach(async () => {
  if (!open) return
  const { gw, traced, collector, upstream, t } = open
  open = undefined
  await gw.close()
  await traced.shutdown()
  await collector.close()
  await upstream.close()
  await t.close()
})

/** Every traceparent the upstream's `index`th request carried, as sent. */
function traceparents(upstream: TestUpstream, index: number): string[] {
  const raw = upstream.received[index]!.rawHeaders
  return raw.filter((_v, i) => i % 2 === 1 && raw[i - 1]!.toLowerCase() === 'traceparent')
}

describe(`trace context on ${backend.name}`, () => {
  it("continues the caller's trace: the SERVER span is its child, and the upstream gets the CLIENT span's context and the caller's tracestate", async () => {
    const { gw, upstream, traced, collector } = await setup()
    const res = await post(`${gw.url}/payments/1/capture`, '1', { headers: { traceparent: `00-${traceId}-${callerSpan}-01`, tracestate: 'vendor=abc' } })
    expect(res.status).toBe(200)
    await traced.flush()
    const server = collector.spans.find((s) => s.kind === spanKind.server)!
    const client = collector.spans.find((s) => s.kind === spanKind.client && s.name === 'POST')!
    expect(server).toMatchObject({ traceId, parentSpanId: callerSpan, traceState: 'vendor=abc' })
    expect(traceparents(upstream, 0)).toEqual([`00-${traceId}-${client.spanId}-01`])
    expect(upstream.received[0]!.headers.tracestate).toBe('vendor=abc')
  })

  it('a caller\'s "not sampled" exports nothing, yet the upstream still gets a traceparent of that trace (and the log line its trace_id)', async () => {
    const { gw, upstream, traced, collector, lines } = await setup()
    const res = await post(`${gw.url}/payments/1/capture`, '1', { headers: { traceparent: `00-${traceId}-${callerSpan}-00` } })
    expect(res.status).toBe(200)
    await traced.flush()
    expect(collector.contentTypes).toEqual([])
    const [sent] = traceparents(upstream, 0)
    expect(sent).toMatch(new RegExp(`^00-${traceId}-[0-9a-f]{16}-00$`))
    expect(sent).not.toContain(callerSpan)
    const decision = lines.map((l) => JSON.parse(l)).find((l) => l.event === 'request')
    expect(decision.trace_id).toBe(traceId)
  })

  it('an invalid or doubled traceparent is never passed on: the request starts a trace of its own and the upstream gets exactly one', async () => {
    const { gw, upstream, traced, collector } = await setup()
    const sent: Record<string, string | string[]>[] = [
      { traceparent: `00-${'0'.repeat(32)}-${callerSpan}-01` },
      { traceparent: 'not a traceparent', tracestate: 'vendor=abc' },
      { traceparent: [`00-${traceId}-${callerSpan}-01`, `00-${'a'.repeat(32)}-${callerSpan}-01`] },
    ]
    for (const [i, headers] of sent.entries()) {
      const res = await rawPost(`${gw.url}/payments/${i + 1}/capture`, { 'content-type': 'application/json', 'x-execution-fence': '1', ...headers })
      expect(res.status).toBe(200)
    }
    await traced.flush()
    const servers = collector.spans.filter((s) => s.kind === spanKind.server)
    expect(servers).toHaveLength(3)
    for (const [i, server] of servers.entries()) {
      expect(server.parentSpanId).toBe('')
      const client = collector.spans.find((s) => s.kind === spanKind.client && s.name === 'POST' && s.traceId === server.traceId)!
      expect(traceparents(upstream, i)).toEqual([`00-${server.traceId}-${client.spanId}-01`])
      // A tracestate belongs to the traceparent it came with: without a valid one it is dropped too.
      expect(upstream.received[i]!.headers.tracestate).toBeUndefined()
    }
  })

  it('an upstream that cannot be reached is a 5xx: the SERVER span is ERROR with the problem code, the CLIENT span with the failure kind', async () => {
    const closed = await startUpstream()
    const url = closed.url
    await closed.close()
    const { gw, traced, collector } = await setup({}, url)
    const res = await post(`${gw.url}/payments/1/capture`, '1')
    expect(res.status).toBe(502)
    await traced.flush()
    const server = collector.spans.find((s) => s.kind === spanKind.server)!
    expect(server.status.code).toBe(2)
    expect(server.attributes).toMatchObject({ 'error.type': 'upstream_unreachable', 'fencegate.decision': 'upstream_unreachable', 'http.response.status_code': 502 })
    const client = collector.spans.find((s) => s.kind === spanKind.client && s.name === 'POST')!
    expect(client.status.code).toBe(2)
    expect(client.attributes['error.type']).toBe('unreachable')
    expect(client.attributes['http.response.status_code']).toBeUndefined()
  })
})

describe('telemetry.entity: false', () => {
  it('keeps the entity off the span and everything else on it', async () => {
    const { gw, traced, collector } = await setup({}, undefined, { telemetry: { entity: false } })
    expect((await post(`${gw.url}/payments/42/capture`, '1')).status).toBe(200)
    await traced.flush()
    const server = collector.spans.find((s) => s.kind === spanKind.server)!
    expect(server.attributes['fencegate.entity']).toBeUndefined()
    expect(server.attributes).toMatchObject({ 'fencegate.fence': '1', 'fencegate.decision': 'forwarded', 'url.path': '/payments/42/capture' })
  })
})

describe('a collector in trouble never changes an answer', () => {
  it('one that answers 500: the command is answered as it would be, and the lost spans are logged by count', async () => {
    const { gw, traced, collector, lines, upstream } = await setup()
    collector.answer(500)
    const res = await post(`${gw.url}/payments/1/capture`, '1')
    expect(res.status).toBe(200)
    expect(res.json).toEqual({ method: 'POST', path: '/payments/1/capture', fence: '1' })
    await traced.flush()
    expect(collector.contentTypes).toHaveLength(1)
    expect(lines.map((l) => JSON.parse(l)).filter((l) => l.event === 'trace_export_failed')).toEqual([expect.objectContaining({ spans: 3 })])
    expect(upstream.received).toHaveLength(1)
  })

  it('one that never answers: commands are answered while its export hangs', async () => {
    const { gw, traced, collector } = await setup({ OTEL_EXPORTER_OTLP_TIMEOUT: '60000' })
    collector.answer('hang')
    expect((await post(`${gw.url}/payments/1/capture`, '1')).status).toBe(200)
    void traced.flush()
    await collector.requested(1)
    // The export of the first command's spans is in flight and will not finish; the next commands do.
    for (let fence = 2; fence <= 4; fence++) expect((await post(`${gw.url}/payments/1/capture`, String(fence))).status).toBe(200)
    expect(collector.spans).toEqual([])
    collector.answer(200)
  })

  it('one that is down: the command is answered, and the export gives up at its timeout', async () => {
    const gone = await startCollector()
    const url = gone.url
    await gone.close()
    const { gw, traced, lines } = await setup({ OTEL_EXPORTER_OTLP_ENDPOINT: url, OTEL_EXPORTER_OTLP_TIMEOUT: '300' })
    expect((await post(`${gw.url}/payments/1/capture`, '1')).status).toBe(200)
    await traced.flush()
    expect(lines.some((l) => JSON.parse(l).event === 'trace_export_failed')).toBe(true)
  })
})

describe('without tracing', () => {
  it("fencegate leaves trace context alone: the caller's traceparent and tracestate reach the upstream as sent", async () => {
    const t = await backend.open()
    const upstream = await startUpstream()
    const gw = await startTestGateway({ config: testConfig([route(upstream.url)]), store: t.store })
    try {
      const traceparent = `00-${traceId}-${callerSpan}-01`
      expect((await post(`${gw.url}/payments/1/capture`, '1', { headers: { traceparent, tracestate: 'vendor=abc' } })).status).toBe(200)
      expect(traceparents(upstream, 0)).toEqual([traceparent])
      expect(upstream.received[0]!.headers.tracestate).toBe('vendor=abc')
    } finally {
      await gw.close()
      await upstream.close()
      await t.close()
    }
  })
})
