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
      config: testConfig([route('http://127.0.0.1:9')], { job_types: [{ name: 'report', lease: '45s' }, { name: 'sync', lease: '45s' }] }),
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

  it('lease calls show the job id, the fence and the lease outcome; a stale heartbeat shows its refusal, status unset', async () => {
    const post = async (path: string, body: unknown) => {
      const res = await fetch(`${gw.url}/_fencegate/jobs${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
      return { status: res.status, json: res.status === 204 ? undefined : ((await res.json()) as Record<string, string>) }
    }
    const { job_id: id } = (await post('', { type: 'sync', key: 's-1', payload: { secret: 'not-in-spans' } })).json!
    const first = (await post('/claim', { worker_id: 'w1', types: ['sync'] })).json!
    expect((await post(`/${id}/release`, { worker_id: 'w1', fence: first.fence })).status).toBe(200)
    const second = (await post('/claim', { worker_id: 'w2', types: ['sync'] })).json!
    expect(BigInt(second.fence!)).toBeGreaterThan(BigInt(first.fence!))
    const stale = await post(`/${id}/heartbeat`, { worker_id: 'w1', fence: first.fence })
    expect([stale.status, stale.json!.code]).toEqual([409, 'lease_lost'])
    expect((await post(`/${id}/heartbeat`, { worker_id: 'w2', fence: second.fence })).status).toBe(200)
    expect((await post(`/${id}/complete`, { worker_id: 'w2', fence: second.fence, result: { rows: 1 } })).status).toBe(200)
    await post('/bulk', { jobs: [{ type: 'sync', key: 's-2' }, { type: 'sync', key: 's-3' }] })
    expect((await post('/claim', { worker_id: 'w3', types: ['sync'], max: 5 })).status).toBe(200)
    expect((await post('/claim', { worker_id: 'w3', types: ['sync'] })).status).toBe(204)
    await traced.flush()
    const leased = collector.spans.filter((s) => s.kind === spanKind.server && s.attributes['fencegate.lease.outcome'] !== undefined)
    const shown = leased.map((s) => [s.name, s.attributes['fencegate.job.id'], s.attributes['fencegate.fence'], s.attributes['fencegate.job.count'], s.attributes['fencegate.lease.outcome'], s.status.code])
    const job = '/_fencegate/jobs/{job_id}'
    expect(shown).toEqual([
      ['POST /_fencegate/jobs/claim', id, first.fence, undefined, 'claimed', 0],
      [`POST ${job}/release`, id, first.fence, undefined, 'released', 0],
      ['POST /_fencegate/jobs/claim', id, second.fence, undefined, 'claimed', 0],
      // The refusal is the client's (4xx): the status stays unset, the code is the outcome and the decision.
      [`POST ${job}/heartbeat`, id, first.fence, undefined, 'lease_lost', 0],
      [`POST ${job}/heartbeat`, id, second.fence, undefined, 'renewed', 0],
      [`POST ${job}/complete`, id, second.fence, undefined, 'completed', 0],
      ['POST /_fencegate/jobs/claim', undefined, undefined, 2, 'claimed', 0],
      ['POST /_fencegate/jobs/claim', undefined, undefined, undefined, 'none', 0],
    ])
    expect(leased[3]!.attributes['fencegate.decision']).toBe('lease_lost')
    // Identifiers only: no payload or result reaches the tracing backend.
    for (const s of collector.spans) expect(JSON.stringify(s.attributes)).not.toMatch(/not-in-spans|rows/)
  })
})

function system(name: string): string {
  return name === 'postgres' ? 'postgresql' : 'pglite'
}
