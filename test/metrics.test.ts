import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { ServerType } from '@hono/node-server'
import type { AddressInfo } from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createAdminApp } from '../src/admin/app.js'
import { createDataPlane } from '../src/gateway/app.js'
import { parseConfig } from '../src/config/schema.js'
import { createJobStore } from '../src/leases/store.js'
import { silentLogger } from '../src/observe/log.js'
import { instrument, readStoreGauges } from '../src/observe/metrics.js'
import { dataPlaneListener, honoListener, listen, startGateway } from '../src/runtime/node/gateway.js'
import { createUndiciForward } from '../src/runtime/node/forward.js'
import { createPromMetrics } from '../src/runtime/node/metrics.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, testConfig } from './helpers/gateway.js'
import { hmacAuthenticator, token } from './helpers/tokens.js'
import { gate, startUpstream, type TestUpstream } from './helpers/upstream.js'

/** The value of one sample in Prometheus text: `name` with exactly these labels, or undefined. */
function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  const want = Object.entries(labels).map(([k, v]) => `${k}="${v}"`).sort().join(',')
  for (const line of text.split('\n')) {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line)
    if (!m || m[1] !== name) continue
    const have = (m[2] ?? '').split(/,(?=[a-zA-Z_]+=")/).filter(Boolean).sort().join(',')
    if (have === want) return Number(m[3])
  }
  return undefined
}

async function scrape(adminUrl: string, headers: Record<string, string> = {}) {
  const res = await fetch(`${adminUrl}/metrics`, { headers })
  return { status: res.status, type: res.headers.get('content-type'), requestId: res.headers.get('x-request-id'), text: await res.text() }
}

const jobTypes = [{ name: 'report', lease: '45s', max_attempts: 5 }]

describe.each(backends())('metrics on $name', (backend) => {
  let t: TestDb
  let upstream: TestUpstream
  let servers: ServerType[]
  let close: () => Promise<void>
  let url: string
  let adminUrl: string
  const hold = gate()

  beforeAll(async () => {
    t = await backend.open()
    upstream = await startUpstream(async (req, res) => {
      if (req.headers['idempotency-key'] === 'held') await hold.opened
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('{"ok":true}')
    })
    const config = testConfig([route(upstream.url, { idempotency: 'optional' })], { job_types: jobTypes })
    const metrics = createPromMetrics({ readGauges: () => readStoreGauges(t.db) })
    const undici = createUndiciForward()
    const store = instrument(t.store, metrics)
    const plane = createDataPlane({ config, store, forward: undici.forward, jobs: instrument(createJobStore(t.db), metrics), metrics })
    const admin = createAdminApp({ store, metrics, exposition: metrics })
    servers = [await listen(dataPlaneListener(plane, silentLogger), '127.0.0.1', 0, config.server), await listen(honoListener(admin.fetch), '127.0.0.1', 0, config.server)]
    url = `http://127.0.0.1:${(servers[0]!.address() as AddressInfo).port}`
    adminUrl = `http://127.0.0.1:${(servers[1]!.address() as AddressInfo).port}`
    close = async () => {
      await Promise.all(servers.map((s) => new Promise<void>((resolve) => {
        s.close(() => resolve())
        if ('closeAllConnections' in s) s.closeAllConnections()
      })))
      await undici.close()
    }
  })
  afterAll(async () => {
    hold.open()
    await close()
    await upstream.close()
    await t.close()
  })

  it('counts forwarded, replayed and rejected requests by route, outcome and code, with store and upstream latency', async () => {
    const before = (await scrape(adminUrl)).text
    const capture = `${url}/payments/7/capture`
    const answers = [
      await post(capture, '5', { headers: { 'idempotency-key': 'k1', 'x-request-id': 'm-forwarded' } }),
      await post(capture, '5', { headers: { 'idempotency-key': 'k1', 'x-request-id': 'm-replayed' } }),
      await post(capture, '4', { headers: { 'x-request-id': 'm-stale' } }),
      await post(capture, undefined, { headers: { 'x-request-id': 'm-required' } }),
      await post(`${url}/nowhere`, '1', { headers: { 'x-request-id': 'm-no-route' } }),
    ]
    expect(answers.map((a) => a.status)).toEqual([200, 200, 409, 428, 404])
    expect(answers[1]!.headers.get('idempotent-replayed')).toBe('true')
    // Every answer, replays and errors included, carries the request id it was given.
    expect(answers.map((a) => a.headers.get('x-request-id'))).toEqual(['m-forwarded', 'm-replayed', 'm-stale', 'm-required', 'm-no-route'])

    const after = await scrape(adminUrl)
    expect(after.status).toBe(200)
    expect(after.type).toBe('text/plain; version=0.0.4; charset=utf-8')
    expect(after.requestId).toBeTruthy()
    const delta = (name: string, labels: Record<string, string> = {}) => (sample(after.text, name, labels) ?? 0) - (sample(before, name, labels) ?? 0)
    expect(delta('fencegate_requests_total', { route: 'capture', outcome: 'forwarded' })).toBe(1)
    expect(delta('fencegate_requests_total', { route: 'capture', outcome: 'replayed' })).toBe(1)
    expect(delta('fencegate_requests_total', { route: 'capture', outcome: 'rejected', code: 'stale_fence' })).toBe(1)
    expect(delta('fencegate_requests_total', { route: 'capture', outcome: 'rejected', code: 'fence_required' })).toBe(1)
    expect(delta('fencegate_requests_total', { outcome: 'rejected', code: 'no_route' })).toBe(1)
    expect(delta('fencegate_request_duration_seconds_count', { route: 'capture', outcome: 'rejected' })).toBe(2)
    // The forward and the replay both had fence 5 accepted (the replay writes nothing); the stale fence 4 was not.
    expect(delta('fencegate_highest_fence_updates_total', { route: 'capture' })).toBe(2)
    expect(delta('fencegate_upstream_duration_seconds_count', { route: 'capture' })).toBe(1)
    expect(delta('fencegate_store_duration_seconds_count', { call: 'reserve', result: 'ok' })).toBe(3)
    expect(delta('fencegate_store_duration_seconds_count', { call: 'complete', result: 'ok' })).toBe(1)
    expect(delta('fencegate_store_duration_seconds_count', { call: 'recordRejection', result: 'ok' })).toBe(1)
    expect(sample(after.text, 'fencegate_idempotency_records', { state: 'completed' })).toBe(1)
    // Never an entity, a key or a tenant as a label.
    for (const leak of ['payments/7', 'invoice:7', 'k1', 'tenant=']) expect(after.text).not.toContain(leak)
  })

  it('reads in-flight idempotency records at scrape time', async () => {
    const pending = post(`${url}/payments/8/capture`, '1', { headers: { 'idempotency-key': 'held' } })
    await upstream.arrived(upstream.received.length + 1)
    expect(sample((await scrape(adminUrl)).text, 'fencegate_idempotency_records', { state: 'in_flight' })).toBe(1)
    hold.open()
    expect((await pending).status).toBe(200)
    expect(sample((await scrape(adminUrl)).text, 'fencegate_idempotency_records', { state: 'in_flight' })).toBeUndefined()
  })

  it('counts claims, reclaims after expiry, expired leases, heartbeats, failed renewals and result rejections', async () => {
    const jobs = (path: string, body: unknown) => post(`${url}/_fencegate/jobs${path}`, undefined, { body: JSON.stringify(body) })
    const count = async (name: string, labels: Record<string, string> = {}) => sample((await scrape(adminUrl)).text, name, labels)
    const { json: job } = await jobs('', { type: 'report', key: 'metrics-1' })
    const first = await jobs('/claim', { worker_id: 'w1' })
    expect(first.status).toBe(200)
    expect(first.json.reclaimed).toBeUndefined()
    expect(await count('fencegate_job_claims_total', { type: 'report' })).toBe(1)
    expect(await count('fencegate_job_reclaims_total', { type: 'report' })).toBeUndefined()
    expect(await count('fencegate_jobs', { type: 'report', state: 'running' })).toBe(1)
    expect(await count('fencegate_jobs_lease_expired', { type: 'report' })).toBe(0)

    // 10 s of a 45 s lease left, by the database clock: the heartbeat comes 35 s after the claim.
    await t.db.sql`UPDATE fg_jobs SET lease_until = now() + interval '10 seconds' WHERE id = ${job.job_id}::bigint`
    const beat = await jobs(`/${job.job_id}/heartbeat`, { worker_id: 'w1', fence: first.json.fence })
    expect(beat.status).toBe(200)
    expect(Object.keys(beat.json).sort()).toEqual(['cancel_requested', 'lease_ms', 'lease_remaining_ms', 'lease_until'])
    const text = (await scrape(adminUrl)).text
    const bucket = (name: string, le: string) => sample(text, `${name}_bucket`, { type: 'report', le })
    expect([bucket('fencegate_lease_remaining_seconds', '5'), bucket('fencegate_lease_remaining_seconds', '10')]).toEqual([0, 1])
    expect([bucket('fencegate_heartbeat_age_seconds', '30'), bucket('fencegate_heartbeat_age_seconds', '45')]).toEqual([0, 1])

    // The lease runs out (moved into the past on the database clock): counted as expired until reclaimed.
    await t.db.sql`UPDATE fg_jobs SET lease_until = now() - interval '1 second' WHERE id = ${job.job_id}::bigint`
    expect(await count('fencegate_jobs_lease_expired', { type: 'report' })).toBe(1)
    expect((await jobs(`/${job.job_id}/heartbeat`, { worker_id: 'w1', fence: first.json.fence })).json.reason).toBe('expired')
    const second = await jobs('/claim', { worker_id: 'w2' })
    expect([second.status, second.json.fence]).toEqual([200, '2'])
    expect(await count('fencegate_job_claims_total', { type: 'report' })).toBe(2)
    expect(await count('fencegate_job_reclaims_total', { type: 'report' })).toBe(1)
    expect(await count('fencegate_jobs_lease_expired', { type: 'report' })).toBe(0)

    expect((await jobs(`/${job.job_id}/heartbeat`, { worker_id: 'w1', fence: first.json.fence })).json.reason).toBe('superseded')
    expect((await jobs(`/${job.job_id}/complete`, { worker_id: 'w1', fence: first.json.fence, result: 1 })).json.code).toBe('not_owner')
    expect((await jobs(`/${job.job_id}/complete`, { worker_id: 'w2', fence: '2', result: 2 })).status).toBe(200)
    const end = (await scrape(adminUrl)).text
    expect(sample(end, 'fencegate_lease_renewal_failures_total', { reason: 'expired' })).toBe(1)
    expect(sample(end, 'fencegate_lease_renewal_failures_total', { reason: 'superseded' })).toBe(1)
    expect(sample(end, 'fencegate_job_result_rejections_total', { reason: 'superseded' })).toBe(1)
    expect(sample(end, 'fencegate_jobs', { type: 'report', state: 'succeeded' })).toBe(1)
    expect(sample(end, 'fencegate_jobs', { type: 'report', state: 'running' })).toBeUndefined()
    expect(sample(end, 'fencegate_store_duration_seconds_count', { call: 'claimOne', result: 'ok' })).toBeGreaterThanOrEqual(2)

    // A release is counted by type; a refused one is not (it is a failed renewal's reason instead).
    const { json: other } = await jobs('', { type: 'report', key: 'metrics-release' })
    const held = await jobs('/claim', { worker_id: 'w3' })
    expect((await jobs(`/${other.job_id}/release`, { worker_id: 'w3', fence: held.json.fence })).status).toBe(200)
    expect((await jobs(`/${other.job_id}/release`, { worker_id: 'w3', fence: held.json.fence })).json.reason).toBe('released')
    expect(await count('fencegate_job_releases_total', { type: 'report' })).toBe(1)
    // Leave nothing claimable for the tests after this one.
    const again = await jobs('/claim', { worker_id: 'w3' })
    expect((await jobs(`/${other.job_id}/complete`, { worker_id: 'w3', fence: again.json.fence })).status).toBe(200)
  })

  it('regression: the job API answered without X-Request-Id', async () => {
    const jobs = (path: string, body: unknown, id: string) => post(`${url}/_fencegate/jobs${path}`, undefined, { body: JSON.stringify(body), headers: { 'x-request-id': id } })
    const started = await jobs('', { type: 'report', key: 'request-id-1' }, 'rid-start')
    const claimed = await jobs('/claim', { worker_id: 'w9' }, 'rid-claim')
    const empty = await jobs('/claim', { worker_id: 'w9' }, 'rid-empty')
    const refused = await jobs('/claim', { worker_id: '' }, 'rid-bad')
    expect([started.status, claimed.status, empty.status, refused.status]).toEqual([201, 200, 204, 400])
    expect([started, claimed, empty, refused].map((a) => a.headers.get('x-request-id'))).toEqual(['rid-start', 'rid-claim', 'rid-empty', 'rid-bad'])
  })

  it('leaves the database gauges out, and says so, when the store cannot be read', async () => {
    const broken = createPromMetrics({ readGauges: () => Promise.reject(new Error('down')) })
    const text = await broken.render()
    expect(sample(text, 'fencegate_gauge_read_failures_total')).toBe(1)
    expect(text).not.toMatch(/^fencegate_jobs\{/m)
  })
})

describe('GET /metrics on the admin plane', () => {
  let t: TestDb
  beforeAll(async () => {
    t = await backends()[0]!.open()
  })
  afterAll(async () => {
    await t.close()
  })

  it('is protected like the other admin endpoints: a token with fencegate:admin', async () => {
    const metrics = createPromMetrics()
    const admin = createAdminApp({ store: t.store, authenticate: await hmacAuthenticator(), metrics, exposition: metrics })
    const get = async (claims?: Record<string, unknown>) => (await admin.request('/metrics', { headers: claims ? { authorization: `Bearer ${await token(claims)}` } : {} })).status
    expect(await get()).toBe(401)
    expect(await get({ scope: 'fencegate:audit' })).toBe(403)
    expect(await get({ scope: 'fencegate:admin' })).toBe(200)
    const text = await metrics.render()
    expect(sample(text, 'fencegate_admin_requests_total', { endpoint: '/metrics', status: '401' })).toBe(1)
    expect(sample(text, 'fencegate_admin_requests_total', { endpoint: '/metrics', status: '403' })).toBe(1)
  })

  it('does not exist without an exposition (the Workers entry)', async () => {
    expect((await createAdminApp({ store: t.store }).request('/metrics')).status).toBe(404)
  })
})

describe.each(backends())('startGateway serves /metrics over HTTP on $name', (backend) => {
  it('with the rules version, request and store metrics and Node process metrics', async () => {
    const t = await backend.open()
    const dir = mkdtempSync(join(tmpdir(), 'fencegate-metrics-'))
    const upstream = await startUpstream()
    const config = parseConfig({
      server: { port: 0, admin_port: 0 }, store: { data_dir: dir }, log: { level: 'silent' },
      routes: [route(upstream.url)],
    })
    const gw = await startGateway({ config, ...(t.url ? { databaseUrl: t.url } : {}), log: silentLogger })
    try {
      expect((await post(`${gw.dataUrl}/payments/1/capture`, '3')).status).toBe(200)
      const { status, text } = await scrape(gw.adminUrl)
      expect(status).toBe(200)
      expect(sample(text, 'fencegate_requests_total', { route: 'capture', outcome: 'forwarded' })).toBe(1)
      expect(sample(text, 'fencegate_rules_version')).toBeGreaterThanOrEqual(0)
      expect(sample(text, 'fencegate_store_duration_seconds_count', { call: 'reserve', result: 'ok' })).toBe(1)
      expect(text).toContain('process_resident_memory_bytes')
      // Neither store here has a synchronous standby: the embedded one never does, and the test server has none.
      expect([sample(text, 'fencegate_store_durability', { level: 'local' }), sample(text, 'fencegate_store_durability', { level: 'replicated' })]).toEqual([1, 0])
      expect(await (await fetch(`${gw.adminUrl}/health`)).json()).toMatchObject({ durability: 'local' })
    } finally {
      await gw.close()
      await upstream.close()
      await t.close()
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
