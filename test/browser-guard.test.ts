import { request } from 'node:http'
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { startGateway, type RunningGateway } from '../src/runtime/node/gateway.js'
import { silentLogger } from '../src/observe/log.js'
import { browserGuard, browserRefusal } from '../src/http/browser-guard.js'
import { route, testConfig } from './helpers/gateway.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * Web pages against planes without auth, replayed as a browser would send them (node:http,
 * so that `Host`, `Origin` and `Sec-Fetch-Site` go out exactly as written): each of these
 * requests was answered 200 and changed state before the guard (src/http/browser-guard.ts).
 */
function send(base: string, method: string, path: string, headers: Record<string, string>, body?: string): Promise<{ status: number; json: any }> {
  const url = new URL(base)
  return new Promise((resolve, reject) => {
    const req = request({ host: url.hostname, port: url.port, method, path, headers: { ...headers, ...(body !== undefined ? { 'content-length': String(Buffer.byteLength(body)) } : {}) } }, (res) => {
      let text = ''
      res.on('data', (c: Buffer) => (text += c))
      res.on('end', () => resolve({ status: res.statusCode!, json: String(res.headers['content-type']).includes('json') ? JSON.parse(text) : undefined }))
    })
    req.on('error', reject)
    req.end(body)
  })
}

describe('planes without auth keep web pages out', () => {
  let gw: RunningGateway
  let upstream: TestUpstream
  let data: string
  let admin: string
  const rebound = (base: string) => ({ host: `rebind.attacker.example:${new URL(base).port}`, origin: 'http://rebind.attacker.example' })

  beforeAll(async () => {
    upstream = await startUpstream()
    const config = testConfig([route(upstream.url)], {
      server: { port: 0, admin_port: 0, allowed_hosts: ['gateway.internal'] },
      store: { data_dir: mkdtempSync(join(tmpdir(), 'fencegate-guard-')) },
      job_types: [{ name: 'report', lease: '45s' }],
    })
    gw = await startGateway({ config, log: silentLogger })
    data = gw.dataUrl
    admin = gw.adminUrl
  })
  afterAll(async () => {
    await gw?.close(1000)
    await upstream?.close()
  })

  const own = (base: string) => ({ host: new URL(base).host })

  it('a DNS-rebound page cannot bump a fence, change a rule or read the admin plane', async () => {
    const bump = await send(admin, 'POST', '/entities/invoice%3A7/bump', { ...rebound(admin), 'content-type': 'text/plain' }, '{"min_fence":"9223372036854775807"}')
    expect([bump.status, bump.json.code]).toEqual([421, 'host_not_allowed'])
    const rule = await send(admin, 'PUT', '/rules/capture', { ...rebound(admin), 'content-type': 'application/json' }, JSON.stringify(route('http://attacker.example')))
    expect(rule.status).toBe(421)
    const read = await send(admin, 'GET', '/audit', { host: `rebind.attacker.example:${new URL(admin).port}` })
    expect(read.status).toBe(421)
    // Nothing changed: the entity was never bumped.
    expect((await send(admin, 'GET', '/entities/invoice%3A7', own(admin))).status).toBe(404)
  })

  it('a cross-site page cannot start or cancel jobs, nor send fenced commands', async () => {
    const start = await send(data, 'POST', '/_fencegate/jobs', { ...own(data), 'content-type': 'text/plain' }, '{"type":"report","key":"k"}')
    expect([start.status, start.json.code]).toEqual([415, 'unsupported_media_type'])
    const created = await send(data, 'POST', '/_fencegate/jobs', { ...own(data), 'content-type': 'application/json' }, '{"type":"report","key":"k"}')
    expect(created.status).toBe(201)
    const cancel = await send(data, 'POST', `/_fencegate/jobs/${created.json.job_id}/cancel`, { ...own(data), origin: 'https://attacker.example', 'content-type': 'application/x-www-form-urlencoded' }, 'x=1')
    expect([cancel.status, cancel.json.code]).toEqual([403, 'cross_site_request'])
    const fenced = await send(data, 'POST', '/payments/1/capture', { ...own(data), 'sec-fetch-site': 'cross-site', 'x-execution-fence': '9', 'content-type': 'text/plain' }, '{}')
    expect([fenced.status, fenced.json.code]).toEqual([403, 'cross_site_request'])
    expect(upstream.received).toHaveLength(0)
    expect((await send(data, 'GET', `/_fencegate/jobs/${created.json.job_id}`, own(data))).json.state).toBe('queued')
  })

  it('clients that are not browsers, the console\'s own page and the named hosts are served as before', async () => {
    expect((await send(data, 'POST', '/payments/2/capture', { ...own(data), 'x-execution-fence': '1', 'content-type': 'application/json' }, '{}')).status).toBe(200)
    expect((await send(data, 'POST', '/payments/2/capture', { host: 'gateway.internal', 'x-execution-fence': '1' }, '{}')).status).toBe(200)
    const sameOrigin = { ...own(admin), origin: new URL(admin).origin, 'sec-fetch-site': 'same-origin', 'content-type': 'application/json' }
    expect((await send(admin, 'POST', '/entities/invoice%3A2/bump', sameOrigin, '{"min_fence":"5"}')).status).toBe(200)
    expect((await send(admin, 'GET', '/ui/', { ...own(admin), 'sec-fetch-site': 'none' })).status).toBe(200)
    expect((await send(admin, 'GET', '/health', { host: `localhost:${new URL(admin).port}` })).status).toBe(200)
  })
})

describe('the hosts a plane without auth serves', () => {
  const refusal = (listen: string, host: string, allowed: string[] = []) => browserRefusal(new Headers({ host }), 'GET', browserGuard(listen, allowed), false)?.code

  it('a plane on 0.0.0.0 serves loopback names only, until its names are listed in server.allowed_hosts', () => {
    expect(refusal('0.0.0.0', '127.0.0.1:8080')).toBeUndefined()
    expect(refusal('0.0.0.0', '[::1]:8080')).toBeUndefined()
    expect(refusal('0.0.0.0', 'localhost')).toBeUndefined()
    expect(refusal('0.0.0.0', '0.0.0.0:8080')).toBe('host_not_allowed')
    expect(refusal('0.0.0.0', 'fencegate:8080')).toBe('host_not_allowed')
    expect(refusal('0.0.0.0', 'Fencegate:8080', ['fencegate'])).toBeUndefined()
    expect(refusal('10.0.0.5', '10.0.0.5:8080')).toBeUndefined()
  })
})
