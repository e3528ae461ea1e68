import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { checkFenceOrder, installFenceLog, type Outcome } from './helpers/fence-log.js'
import { post } from './helpers/gateway.js'
import { startGatewayProcess, startGatewayProcesses, writeConfig, type GatewayProcess } from './helpers/process.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

const postgres = backends().find((b) => b.name === 'postgres')

describe.skipIf(!postgres)('two gateway processes on one PostgreSQL', () => {
  let t: TestDb
  let upstream: TestUpstream
  let gateways: GatewayProcess[] = []

  beforeAll(async () => {
    t = await postgres!.open()
    await installFenceLog(t.db)
    upstream = await startUpstream()
    const config = writeConfig({
      server: { port: 0, admin_port: 0 },
      log: { level: 'info' },
      routes: [{ name: 'capture', method: 'POST', path: '/payments/:invoice_id/capture', upstream: upstream.url, entity: 'invoice:{params.invoice_id}' }],
    })
    const args = ['--config', config, '--database-url', t.url!]
    gateways = await startGatewayProcesses([args, args])
  })
  afterAll(async () => {
    await Promise.all(gateways.map((g) => g.stop()))
    await upstream?.close()
    await t?.close()
  })

  it('enforce one fence order over 200 parallel requests split between them', async () => {
    const fences = Array.from({ length: 200 }, (_, i) => 1 + ((i * 6007 + 5) % 89))
    const outcomes: Outcome[] = await Promise.all(fences.map(async (fence, i) => {
      const requestId = `p-${i}`
      const res = await post(`${gateways[i % 2]!.dataUrl}/payments/7/capture`, String(fence), { headers: { 'x-request-id': requestId } })
      return { requestId, fence, status: res.status, body: res.json }
    }))
    // A store failure would show here with its SQLSTATE (53300: the server had no connection slot left).
    expect(gateways.flatMap((g) => g.lines.filter((l) => l.includes('"event":"store_failed"')))).toEqual([])
    const forwarded = upstream.received.map((r) => Number(r.headers['x-execution-fence']))
    const entity = await t.store.getEntity('default', 'invoice:7')
    await checkFenceOrder(t.db, outcomes, forwarded, entity!.highest_fence)
    // Both processes took part, and each logged its decisions.
    for (const g of gateways) expect(g.lines.filter((l) => l.includes('"event":"request"')).length).toBeGreaterThan(50)
  })

  it('stop cleanly on SIGTERM', async () => {
    expect(await Promise.all(gateways.map((g) => g.stop()))).toEqual([0, 0])
  })
})

// Each gateway here is a new Node process starting PGlite: up to 18 s apiece on a loaded
// 2-core host, and one test starts three in a row.
describe('starting gateway processes together', { timeout: 180_000 }, () => {
  it('a gateway that fails to start does not leave the one started beside it running', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'fencegate-siblings-'))
    const config = writeConfig({
      server: { port: 0, admin_port: 0 },
      log: { level: 'info' },
      routes: [{ name: 'capture', method: 'POST', path: '/payments/:invoice_id/capture', upstream: 'http://127.0.0.1:9', entity: 'invoice:{params.invoice_id}' }],
    })
    const healthy = ['--config', config, '--data-dir', join(dir, 'store')]
    await expect(startGatewayProcesses([healthy, ['--config', join(dir, 'missing.yaml')]])).rejects.toThrow(/gateway exited/)
    // The healthy one held its data directory's lock: another gateway gets it only once that one stopped.
    const next = await startGatewayProcess(healthy)
    expect(await next.stop()).toBe(0)
  })

  it('a SIGTERM sent the moment a gateway logs listening drains it and exits 0, never kills it', async () => {
    // The signal handlers used to be installed only after start-up returned, just after the
    // `listening` line: a SIGTERM in between killed the process (exit by signal, no drain).
    const config = writeConfig({
      server: { port: 0, admin_port: 0 },
      log: { level: 'info' },
      routes: [{ name: 'capture', method: 'POST', path: '/payments/:invoice_id/capture', upstream: 'http://127.0.0.1:9', entity: 'invoice:{params.invoice_id}' }],
    })
    const dir = mkdtempSync(join(tmpdir(), 'fencegate-sigterm-'))
    for (let i = 0; i < 3; i++) {
      const gateway = await startGatewayProcess(['--config', config, '--data-dir', join(dir, `store-${i}`)])
      expect(await gateway.stop()).toBe(0)
    }
  })
})
