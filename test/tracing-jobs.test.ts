import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createJobStore } from '../src/leases/store.js'
import { silentLogger } from '../src/observe/log.js'
import { startTracing, type NodeTracing } from '../src/runtime/node/tracing.js'
import { tracingSettings } from '../src/runtime/node/tracing-env.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { spanKind, startCollector, type Collector } from './helpers/otlp.js'

describe.each(backends())('job API spans on $name', (backend) => {
  let t: TestDb
  let collector: Collector
  let traced: NodeTracing
  let gw: TestGateway
  beforeAll(async () => {
    t = await backend.open()
    collector = await startCollector()
    traced = startTracing(tracingSettings({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: collector.url })!, silentLogger)
    gw = await startTestGateway({
      config: testConfig([route('http://127.0.0.1:9')], { job_types: [{ name: 'report', lease: '45s' }] }),
      store: t.store, jobs: createJobStore(t.db), tracing: traced.tracing, storeSystem: system(backend.name),
    })
  })
  afterAll(async () => {
    await gw.close()
    await traced.shutdown()
    await collector.close()
    await t.close()
  })

  it('each call is a SERVER span named by its route template, with the job id, and its statements as children', async () => {
    const started = await fetch(`${gw.url}/_fencegate/jobs`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ type: 'report', key: 'r-1', payload: {} }) })
    expect(started.status).toBe(201)
    const { job_id: id } = (await started.json()) as { job_id: string }
    expect((await fetch(`${gw.url}/_fencegate/jobs/${id}`)).status).toBe(200)
    expect((await fetch(`${gw.url}/_fencegate/jobs/9999`)).status).toBe(404)
    await traced.flush()
    const servers = collector.spans.filter((s) => s.kind === spanKind.server)
    expect(servers.map((s) => [s.name, s.attributes['http.response.status_code'], s.attributes['fencegate.job.id'], s.attributes['fencegate.decision']])).toEqual([
      ['POST /_fencegate/jobs', 201, undefined, undefined],
      ['GET /_fencegate/jobs/{job_id}', 200, id, undefined],
      ['GET /_fencegate/jobs/{job_id}', 404, '9999', 'job_not_found'],
    ])
    for (const server of servers) {
      expect(server.attributes['http.route']).toBe(server.name.split(' ')[1])
      const children = collector.spans.filter((s) => s.parentSpanId === server.spanId)
      expect(children.length).toBeGreaterThan(0)
      for (const c of children) expect(c.attributes['db.system.name']).toBe(system(backend.name))
    }
  })
})

function system(name: string): string {
  return name === 'postgres' ? 'postgresql' : 'pglite'
}
