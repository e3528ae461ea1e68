import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { silentLogger } from '../src/observe/log.js'
import { startTracing, type NodeTracing } from '../src/runtime/node/tracing.js'
import { tracingSettings } from '../src/runtime/node/tracing-env.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { spanKind, startCollector, type Collector } from './helpers/otlp.js'

// The security review: the admin plane's SERVER spans carried the path as sent in `url.path`,
// so `DELETE /idempotency/<key>` put a tenant's idempotency key in clear into the tracing
// backend (and `/entities/<entity>` the entity, which `telemetry.entity: false` promises to keep out).
describe.each(backends())('admin-plane spans on $name', (backend) => {
  let t: TestDb
  let collector: Collector
  let traced: NodeTracing
  let gw: TestGateway
  beforeAll(async () => {
    t = await backend.open()
    collector = await startCollector()
    traced = startTracing(tracingSettings({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: collector.url })!, silentLogger)
    gw = await startTestGateway({ config: testConfig([route('http://127.0.0.1:9')], { telemetry: { entity: false } }), store: t.store, tracing: traced.tracing })
  })
  afterAll(async () => {
    await gw.close()
    await traced.shutdown()
    await collector.close()
    await t.close()
  })

  it('carry no idempotency key or entity from the path: url.path is the route template, and an unmatched path is left out', async () => {
    const key = 'pay-7f3a91-SECRET'
    const entity = 'invoice:SECRET-42'
    const calls: [string, string][] = [
      ['GET', `/idempotency/${key}?tenant=acme`],
      ['DELETE', `/idempotency/${key}?tenant=acme`],
      ['GET', `/entities/${entity}`],
      ['GET', `/idempotency/${key}/no-such-endpoint`],
    ]
    for (const [method, path] of calls) expect((await fetch(`${gw.adminUrl}${path}`, { method })).status).toBe(404)
    await traced.flush()
    const spans = collector.spans
    expect(spans.filter((s) => s.kind === spanKind.server).map((s) => [s.name, s.attributes['url.path'], s.attributes['http.route']])).toEqual([
      ['GET /idempotency/:key', '/idempotency/{key}', '/idempotency/:key'],
      ['DELETE /idempotency/:key', '/idempotency/{key}', '/idempotency/:key'],
      ['GET /entities/:entity', '/entities/{entity}', '/entities/:entity'],
      ['GET', undefined, undefined],
    ])
    for (const span of spans) {
      const text = JSON.stringify([span.name, span.attributes])
      expect(text).not.toContain('SECRET')
    }
  })
})
