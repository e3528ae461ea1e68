import postgres from 'postgres'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { StoreError } from '../src/store/db.js'
import { connectPostgres } from '../src/store/postgres.js'
import { postgresBinaries, startCluster, type Cluster } from './helpers/cluster.js'
import { checkFenceOrder, installFenceLog, type Outcome } from './helpers/fence-log.js'
import { post } from './helpers/gateway.js'
import { startGatewayProcesses, writeConfig } from './helpers/process.js'
import { startUpstream } from './helpers/upstream.js'

/**
 * PostgreSQL out of connection slots (`max_connections` taken by other clients): a statement
 * whose new connection is refused (53300) waits for a connection the pool already has, and
 * only a pool with none fails closed. On a throwaway cluster of this file's own.
 */
const bin = postgresBinaries()

describe.skipIf(!bin)('a pool on a PostgreSQL with no connection slot left', () => {
  let cluster: Cluster
  let hogs: postgres.Sql[] = []

  beforeAll(async () => {
    cluster = await startCluster(bin!, { maxConnections: 12 })
  }, 120_000)
  afterEach(async () => {
    await Promise.all(hogs.map((h) => h.end({ timeout: 1 })))
    hogs = []
  })
  afterAll(() => cluster?.destroy())

  /** Takes every free slot of the server with other clients, then gives `free` of them back. */
  async function takeSlots(free: number): Promise<void> {
    for (;;) {
      const hog = postgres(cluster.url, { max: 1, fetch_types: false, onnotice: () => {}, connection: { application_name: 'hog' } })
      try {
        await hog`SELECT 1`
        hogs.push(hog)
      } catch (err) {
        await hog.end({ timeout: 1 })
        expect((err as { code?: string }).code).toBe('53300')
        break
      }
    }
    const given = hogs.splice(0, free)
    await Promise.all(given.map((h) => h.end({ timeout: 1 })))
  }

  it('runs 100 parallel statements on the 3 connections the server grants a pool of 20, none refused', async () => {
    const db = connectPostgres(cluster.url, { max: 20 })
    try {
      await takeSlots(3)
      await db.sql`SELECT 1`
      const rows = await Promise.all(Array.from({ length: 100 }, (_, i) =>
        db.sql<{ pid: number; i: number }>`SELECT pg_backend_pid() AS pid, ${i}::int AS i, pg_sleep(0.02)`))
      expect(rows.map((r) => r[0]!.i)).toEqual(Array.from({ length: 100 }, (_, i) => i))
      const pids = new Set(rows.map((r) => r[0]!.pid))
      expect(pids.size).toBeGreaterThanOrEqual(1)
      expect(pids.size).toBeLessThanOrEqual(3)
    } finally {
      await db.close()
    }
  })

  it('fails closed with StoreError 53300 when the pool has no connection to wait for', async () => {
    const db = connectPostgres(cluster.url, { max: 20 })
    try {
      await takeSlots(0)
      const results = await Promise.allSettled(Array.from({ length: 10 }, () => db.sql`SELECT 1`))
      for (const r of results) {
        expect(r.status).toBe('rejected')
        const err = (r as PromiseRejectedResult).reason
        expect([err instanceof StoreError, (err as StoreError).sqlstate]).toEqual([true, '53300'])
      }
    } finally {
      await db.close()
    }
  })

  it('two gateway processes with the default pools keep one fence order over 200 parallel requests, none refused', async () => {
    const upstream = await startUpstream()
    const config = writeConfig({
      server: { port: 0, admin_port: 0 },
      routes: [{ name: 'capture', method: 'POST', path: '/payments/:invoice_id/capture', upstream: upstream.url, entity: 'invoice:{params.invoice_id}' }],
    })
    const gateways = await startGatewayProcesses([['--config', config, '--database-url', cluster.url], ['--config', config, '--database-url', cluster.url]])
    const db = connectPostgres(cluster.url, { max: 1 })
    try {
      // Each gateway serves one command first (on another entity, before the fence log), so each
      // has a connection of its own; then the rest of the server's 12 slots go to other clients but 2.
      for (const g of gateways) expect((await post(`${g.dataUrl}/payments/1/capture`, '1')).status).toBe(200)
      await installFenceLog(db)
      await takeSlots(2)
      const fences = Array.from({ length: 200 }, (_, i) => 1 + ((i * 6007 + 5) % 89))
      const outcomes: Outcome[] = await Promise.all(fences.map(async (fence, i) => {
        const res = await post(`${gateways[i % 2]!.dataUrl}/payments/7/capture`, String(fence), { headers: { 'x-request-id': `s-${i}` } })
        return { requestId: `s-${i}`, fence, status: res.status, body: res.json }
      }))
      expect(gateways.flatMap((g) => g.lines.filter((l) => l.includes('"event":"store_failed"')))).toEqual([])
      const forwarded = upstream.received.filter((r) => r.path.startsWith('/payments/7/')).map((r) => Number(r.headers['x-execution-fence']))
      const [entity] = await db.sql<{ highest_fence: string }>`SELECT highest_fence::text FROM fg_fences WHERE entity = 'invoice:7'`
      await checkFenceOrder(db, outcomes, forwarded, entity!.highest_fence)
    } finally {
      await db.close()
      await Promise.all(gateways.map((g) => g.stop()))
      await upstream.close()
    }
  })
})
