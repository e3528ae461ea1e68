import { request as httpRequest } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createAdminApp } from '../../src/admin/app.js'
import { createDataPlane } from '../../src/gateway/app.js'
import { parseConfig, type Config } from '../../src/config/schema.js'
import type { Forward } from '../../src/gateway/forward.js'
import type { OutcomeWaits } from '../../src/gateway/outcome-waits.js'
import { noAuthentication, type Authenticate } from '../../src/http/identity.js'
import type { BrowserGuard } from '../../src/http/browser-guard.js'
import type { JobStore } from '../../src/leases/store.js'
import { silentLogger, type Logger } from '../../src/observe/log.js'
import type { Tracing } from '../../src/observe/tracing.js'
import { dataPlaneListener, honoListener, listen } from '../../src/runtime/node/gateway.js'
import { createUndiciForward } from '../../src/runtime/node/forward.js'
import { loadUpstreamTls } from '../../src/runtime/node/upstream-tls.js'
import type { Store } from '../../src/store/store.js'
import type { RuleRegistry } from '../../src/rules/registry.js'
import type { Db } from '../../src/store/db.js'

/** A route for tests: fenced per invoice by default. */
export function route(upstream: string, overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    name: 'capture',
    method: 'POST',
    path: '/payments/:invoice_id/capture',
    upstream,
    entity: 'invoice:{params.invoice_id}',
    fence: 'required',
    timeout_ms: 5000,
    ...overrides,
  }
}

export function testConfig(routes: Record<string, unknown>[], extra: Record<string, unknown> = {}): Config {
  return parseConfig({ routes, log: { level: 'silent' }, ...extra })
}

export interface TestGateway {
  url: string
  adminUrl: string
  close(): Promise<void>
}

/** Serves the real data and admin apps over loopback HTTP with the undici forward, as node.ts does. */
export async function startTestGateway(options: { config: Config; store: Store; log?: Logger; tracing?: Tracing; storeSystem?: string; forward?: Forward; authenticate?: Authenticate; jobs?: JobStore; rules?: { registry: RuleRegistry; db: Db }; db?: Db; outcomeWaits?: OutcomeWaits; browserGuard?: BrowserGuard }): Promise<TestGateway> {
  const undici = createUndiciForward({ tls: loadUpstreamTls(options.config.routes) })
  const authenticate = options.authenticate ?? noAuthentication
  const plane = createDataPlane({ config: options.config, store: options.store, forward: options.forward ?? undici.forward, authenticate, ...(options.jobs ? { jobs: options.jobs } : {}), ...(options.log ? { log: options.log } : {}), ...(options.rules ? { rules: options.rules.registry } : {}), ...(options.tracing ? { tracing: options.tracing } : {}), ...(options.storeSystem ? { storeSystem: options.storeSystem } : {}), ...(options.outcomeWaits ? { outcomeWaits: options.outcomeWaits } : {}), ...(options.browserGuard ? { browserGuard: options.browserGuard } : {}) })
  const admin = createAdminApp({ store: options.store, authenticate, ...(options.rules ? { rules: options.rules } : {}), ...(options.db ? { db: options.db } : {}), ...(options.tracing ? { tracing: options.tracing } : {}) })
  const linger = { timeMs: options.config.server.lingering_time, timeoutMs: options.config.server.lingering_timeout }
  const data = await listen(dataPlaneListener(plane, options.log ?? silentLogger, linger), '127.0.0.1', 0, options.config.server)
  const adminServer = await listen(honoListener(admin.fetch), '127.0.0.1', 0, options.config.server)
  return {
    url: `http://127.0.0.1:${(data.address() as AddressInfo).port}`,
    adminUrl: `http://127.0.0.1:${(adminServer.address() as AddressInfo).port}`,
    async close() {
      await Promise.all([data, adminServer].map((s) => new Promise<void>((resolve) => {
        s.close(() => resolve())
        if ('closeAllConnections' in s) s.closeAllConnections()
      })))
      await undici.close()
    },
  }
}

/** POSTs with the given fence (or none) and returns status and parsed body. */
export async function post(url: string, fence?: string, init: { body?: string; headers?: Record<string, string> } = {}) {
  const headers: Record<string, string> = { 'content-type': 'application/json', ...init.headers }
  if (fence !== undefined) headers['x-execution-fence'] = fence
  const res = await fetch(url, { method: 'POST', headers, body: init.body ?? '{}' })
  const text = await res.text()
  let json: any
  try {
    json = JSON.parse(text)
  } catch {
    json = undefined
  }
  return { status: res.status, headers: res.headers, text, json }
}

/** A POST through node:http, so that headers fetch refuses (`Connection`, duplicates) go out as written. */
export function rawPost(url: string, headers: Record<string, string | string[]>, body: string | Uint8Array = '{}'): Promise<{ status: number; headers: Record<string, unknown>; body: any }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(url, { method: 'POST', headers: { ...headers, 'content-length': String(Buffer.byteLength(body)) } }, (res) => {
      const chunks: Buffer[] = []
      res.on('data', (c: Buffer) => chunks.push(c))
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString()
        let json: unknown = text
        try {
          json = JSON.parse(text)
        } catch {}
        resolve({ status: res.statusCode!, headers: res.headers, body: json })
      })
    })
    req.on('error', reject)
    req.end(body)
  })
}
