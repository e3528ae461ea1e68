import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { post } from './helpers/gateway.js'
import { spanKind, startCollector, type Collector } from './helpers/otlp.js'
import { runCli, startGatewayProcess, tempDir, writeConfig, type GatewayProcess } from './helpers/process.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

const routes = (upstream: string) => [{ name: 'capture', method: 'POST', path: '/payments/:invoice_id/capture', upstream, entity: 'invoice:{params.invoice_id}', idempotency: 'optional' }]

// `fencegate serve` as users run it, with nothing but the OTEL_* variables; PGlite starts slowly in a new process.
describe.each(backends())('fencegate serve with OTEL_TRACES_EXPORTER=otlp on $name', { timeout: 120_000 }, (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let collector: Collector
  let gateway: GatewayProcess

  beforeAll(async () => {
    t = await backend.open()
    upstream = await startUpstream()
    collector = await startCollector()
    const config = writeConfig({ server: { port: 0, admin_port: 0 }, log: { level: 'info' }, routes: routes(upstream.url) })
    const store = t.url ? ['--database-url', t.url] : ['--data-dir', tempDir('fencegate-otel-')]
    gateway = await startGatewayProcess(['--config', config, ...store], {
      OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: collector.url, OTEL_SERVICE_NAME: 'fencegate-e2e', OTEL_RESOURCE_ATTRIBUTES: 'deployment.environment.name=test',
    })
  })
  afterAll(async () => {
    await gateway?.stop()
    await collector?.close()
    await upstream?.close()
    await t?.close()
  })

  it('a fenced command is SERVER → store → CLIENT, the upstream has the CLIENT span\'s context, and a stale one shows its refusal and no CLIENT span', async () => {
    expect((await post(`${gateway.dataUrl}/payments/5/capture`, '3', { headers: { 'idempotency-key': 'e2e-1' } })).status).toBe(200)
    expect((await post(`${gateway.dataUrl}/payments/5/capture`, '2')).status).toBe(409)
    // Stopping drains the gateway, and its last act is to export what it holds.
    expect(await gateway.stop()).toBe(0)
    const spans = collector.spans
    const [forwarded, stale] = [spans.find((s) => s.attributes['fencegate.decision'] === 'forwarded')!, spans.find((s) => s.attributes['fencegate.decision'] === 'stale_fence')!]
    expect(forwarded).toMatchObject({ kind: spanKind.server, name: 'POST /payments/:invoice_id/capture' })
    expect(forwarded.resource).toMatchObject({ 'service.name': 'fencegate-e2e', 'deployment.environment.name': 'test' })
    const children = (server: typeof forwarded) => spans.filter((s) => s.parentSpanId === server.spanId)
    const system = backend.name === 'postgres' ? 'postgresql' : 'pglite'
    expect(children(forwarded).map((s) => [s.name, s.kind, s.attributes['db.system.name']]).sort()).toEqual([
      ['POST', spanKind.client, undefined], ['complete', spanKind.client, system], ['reserve', spanKind.client, system],
    ])
    const client = children(forwarded).find((s) => s.name === 'POST')!
    expect(upstream.received).toHaveLength(1)
    expect(upstream.received[0]!.headers.traceparent).toBe(`00-${forwarded.traceId}-${client.spanId}-01`)
    expect(stale.attributes).toMatchObject({ 'http.response.status_code': 409, 'fencegate.fence': '2' })
    expect(stale.status.code).toBe(0)
    expect(children(stale).map((s) => s.name)).toEqual(['reserve'])
    // The process's decision lines carry the trace they belong to.
    const decisions = gateway.lines.map((l) => JSON.parse(l)).filter((l) => l.event === 'request')
    expect(decisions.map((d) => [d.trace_id, d.span_id])).toEqual([[forwarded.traceId, forwarded.spanId], [stale.traceId, stale.spanId]])
    expect(gateway.lines.some((l) => JSON.parse(l).event === 'tracing')).toBe(true)
  })
})

describe('fencegate serve with an OTEL_* value it cannot use', () => {
  it('does not start, and names the variable', async () => {
    const upstream = await startUpstream()
    const config = writeConfig({ server: { port: 0, admin_port: 0 }, routes: routes(upstream.url) })
    const dataDir = tempDir('fencegate-otel-')
    for (const env of [{ OTEL_TRACES_EXPORTER: 'zipkin' }, { OTEL_TRACES_EXPORTER: 'otlp', OTEL_TRACES_SAMPLER: 'sometimes' }]) {
      const run = await runCli(['serve', '--config', config, '--data-dir', dataDir], env)
      expect(run.code).toBe(2)
      expect(run.stderr).toContain(`${Object.keys(env).at(-1)}:`)
    }
    await upstream.close()
  })
})
