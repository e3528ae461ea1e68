import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createJobStore } from '../src/leases/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'

// The job API's own router (src/leases/api.ts) matches exact paths, as the Hono routes it
// replaced did: every other path under /_fencegate/jobs goes on to the pipeline (no_route).
// Each row was recorded from the Hono version before the change.
const table: [method: string, path: string, status: number, code: string][] = [
  ['POST', '', 400, 'invalid_request'], ['POST', '/', 404, 'no_route'], ['POST', '?x=1', 400, 'invalid_request'],
  ['GET', '', 404, 'no_route'], ['PUT', '', 404, 'no_route'],
  ['POST', '/bulk', 400, 'invalid_request'], ['POST', '/bulk/', 404, 'no_route'], ['GET', '/bulk', 404, 'job_not_found'],
  ['POST', '/claim', 400, 'invalid_request'], ['POST', '/claim/', 404, 'no_route'], ['GET', '/claim', 404, 'job_not_found'],
  ['GET', '/1', 404, 'job_not_found'], ['GET', '/1/', 404, 'no_route'], ['HEAD', '/1', 404, ''], ['GET', '/%31', 404, 'job_not_found'],
  ['GET', '/%zz', 404, 'job_not_found'], ['GET', '/01', 404, 'job_not_found'], ['GET', '/1?from=x', 404, 'job_not_found'],
  ['POST', '/1', 404, 'no_route'], ['DELETE', '/1', 404, 'no_route'],
  ['POST', '/1/heartbeat', 404, 'job_not_found'], ['POST', '/1/heartbeat/', 404, 'no_route'], ['GET', '/1/heartbeat', 404, 'no_route'],
  ['POST', '/1/append', 400, 'invalid_request'], ['POST', '/1/complete', 404, 'job_not_found'], ['POST', '/1/fail', 400, 'invalid_request'],
  ['POST', '/1/release', 404, 'job_not_found'], ['POST', '/1/cancel', 404, 'job_not_found'],
  ['POST', '/1/other', 404, 'no_route'], ['POST', '/1/complete/x', 404, 'no_route'], ['POST', '/x/complete', 404, 'job_not_found'],
  ['POST', '//complete', 404, 'no_route'], ['GET', '//', 404, 'no_route'], ['POST', 'x', 404, 'no_route'], ['POST', '/constructor', 404, 'no_route'],
]

describe.each(backends())('the job API routes on $name', (backend) => {
  let t: TestDb
  let gw: TestGateway
  beforeAll(async () => {
    t = await backend.open()
    gw = await startTestGateway({ config: testConfig([route('http://127.0.0.1:9')], { job_types: [{ name: 'report', lease: '45s' }] }), store: t.store, jobs: createJobStore(t.db) })
  })
  afterAll(async () => {
    await gw.close()
    await t.close()
  })

  it.each(table)('%s /_fencegate/jobs%s → %i %s', async (method, path, status, code) => {
    const hasBody = method !== 'GET' && method !== 'HEAD'
    const res = await fetch(`${gw.url}/_fencegate/jobs${path}`, { method, headers: { 'content-type': 'application/json' }, ...(hasBody ? { body: '{"worker_id":"w","fence":"1"}' } : {}) })
    const text = await res.text()
    expect([res.status, text ? (JSON.parse(text) as { code: string }).code : '']).toEqual([status, code])
    expect(res.headers.get('content-type')).toBe('application/problem+json')
    expect(res.headers.get('x-request-id')).toBeTruthy()
  })
})
