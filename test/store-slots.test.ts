import { readFileSync } from 'node:fs'
import { createServer, connect, type AddressInfo, type Socket } from 'node:net'
import postgres from 'postgres'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { StoreError } from '../src/store/db.js'
import { connectPostgres } from '../src/store/postgres.js'
import { freePort, postgresBinaries, startCluster, type Cluster } from './helpers/cluster.js'
import { checkFenceOrder, installFenceLog, type Outcome } from './helpers/fence-log.js'
import { post } from './helpers/gateway.js'
import { startGatewayProcesses, writeConfig } from './helpers/process.js'
import { startUpstream } from './helpers/upstream.js'

/**
 * PostgreSQL out of connection slots (`max_connections` taken by other clients): a statement
 * whose new connection is refused (53300) waits for a connection the pool already has, the
 * pool opens no more until it probes, and only a pool with none fails closed. On a throwaway
 * cluster of this file's own.
 */
const bin = postgresBinaries()

/** How many new connections the server has refused for want of a slot so far, read from its log. */
const refusedSoFar = (log: string) => readFileSync(log, 'utf8').split('\n').filter((l) => l.startsWith('53300 ')).length

/**
 * A TCP relay to the cluster that passes the first `pass` connections and holds every later
 * one open without a byte: a server whose new connections never come up.
 */
async function startHoldingRelay(port: number, pass: number): Promise<{ url: string; close(): Promise<void> }> {
  const sockets = new Set<Socket>()
  let accepted = 0
  const server = createServer((client) => {
    sockets.add(client)
    client.on('error', () => undefined)
    if (accepted++ >= pass) return
    const target = connect(port, '127.0.0.1')
    sockets.add(target)
    target.on('error', () => client.destroy())
    client.on('close', () => target.destroy())
    client.pipe(target).pipe(client)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `postgres://postgres@127.0.0.1:${(server.address() as AddressInfo).port}/postgres`,
    close: () => new Promise((resolve) => {
      for (const s of sockets) s.destroy()
      server.close(() => resolve())
    }),
  }
}

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

  it('runs 100 parallel statements on the 3 connections the server grants a pool of 20, none refused, opening no connection after the first refusals', async () => {
    // A connect timeout of 10 s is also the pool's probe interval: no probe in this test.
    const db = connectPostgres(cluster.url, { max: 20, connectTimeoutMs: 10_000 })
    try {
      await takeSlots(3)
      await db.sql`SELECT 1`
      const before = refusedSoFar(cluster.log)
      const rows = await Promise.all(Array.from({ length: 100 }, (_, i) =>
        db.sql<{ pid: number; i: number }>`SELECT pg_backend_pid() AS pid, ${i}::int AS i, pg_sleep(0.02)`))
      expect(rows.map((r) => r[0]!.i)).toEqual(Array.from({ length: 100 }, (_, i) => i))
      const pids = new Set(rows.map((r) => r[0]!.pid))
      expect(pids.size).toBeGreaterThanOrEqual(1)
      expect(pids.size).toBeLessThanOrEqual(3)
      // The burst opens at most the 19 connections the pool has not opened yet; after the
      // first refusals, the statements take turns on the live connections (before the cap, every
      // retry opened another one: 70-150 refusals in this test).
      expect(refusedSoFar(cluster.log) - before).toBeLessThanOrEqual(19)
    } finally {
      await db.close()
    }
  })

  it('runs 100 parallel statements on its live connections when new ones do not come up within the connect timeout', async () => {
    const relay = await startHoldingRelay(cluster.port, 2)
    const db = connectPostgres(relay.url, { max: 20, connectTimeoutMs: 300 })
    try {
      await Promise.all([db.sql`SELECT pg_sleep(0.05)`, db.sql`SELECT pg_sleep(0.05)`])
      const rows = await Promise.all(Array.from({ length: 100 }, (_, i) =>
        db.sql<{ pid: number; i: number }>`SELECT pg_backend_pid() AS pid, ${i}::int AS i, pg_sleep(0.01)`))
      expect(rows.map((r) => r[0]!.i)).toEqual(Array.from({ length: 100 }, (_, i) => i))
      expect(new Set(rows.map((r) => r[0]!.pid)).size).toBeLessThanOrEqual(2)
    } finally {
      await db.close()
      await relay.close()
    }
  })

  it('runs a statement whose new connection timed out after the live one went idle on that one, not failing it a connect timeout later', async () => {
    // Nothing in flight wakes a waiter: it used to wait out a second connect timeout and fail.
    const relay = await startHoldingRelay(cluster.port, 1)
    const db = connectPostgres(relay.url, { max: 20, connectTimeoutMs: 300 })
    try {
      await db.sql`SELECT 1`
      // The live connection runs the first; the second opens a connection that never comes up.
      const rows = await Promise.all([db.sql<{ i: number }>`SELECT 1 AS i, pg_sleep(0.05)`, db.sql<{ i: number }>`SELECT 2 AS i`])
      expect(rows.map((r) => r[0]!.i)).toEqual([1, 2])
    } finally {
      await db.close()
      await relay.close()
    }
  })

  it('opens connections again once the server has slots: its probe is not refused', async () => {
    const db = connectPostgres(cluster.url, { max: 20, connectTimeoutMs: 500 })
    const burst = async () => new Set((await Promise.all(Array.from({ length: 40 }, () =>
      db.sql<{ pid: number }>`SELECT pg_backend_pid() AS pid, pg_sleep(0.02)`))).map((r) => r[0]!.pid)).size
    try {
      await takeSlots(2)
      await db.sql`SELECT 1`
      expect(await burst()).toBeLessThanOrEqual(2)
      await Promise.all(hogs.splice(0).map((h) => h.end({ timeout: 1 })))
      // A probe is due a connect timeout after the last refusal, and each burst asks for one. While
      // held, a burst can add only that one connection; once the probe was not refused, one
      // burst opens as many as it needs.
      let connections = 2
      let grew = 0
      for (let i = 0; i < 200 && grew < 5; i++) {
        const now = await burst()
        grew = Math.max(grew, now - connections)
        connections = Math.max(connections, now)
      }
      expect(grew).toBeGreaterThanOrEqual(5)
    } finally {
      await db.close()
    }
  })

  it('serves the waiting statements after the process was not scheduled for longer than the connect timeout: the answers that came meanwhile are read before a waiter fails', async () => {
    // A throttled container or a loaded host stops the process; when it runs again, Node fires
    // its due timers before it reads the sockets. CI failed this way (CONNECT_TIMEOUT at 200 ms).
    const db = connectPostgres(cluster.url, { max: 20, connectTimeoutMs: 500 })
    try {
      await Promise.all([db.sql`SELECT pg_sleep(0.05)`, db.sql`SELECT pg_sleep(0.05)`])
      await takeSlots(0)
      const before = refusedSoFar(cluster.log)
      const burst = Promise.allSettled(Array.from({ length: 6 }, (_, i) => db.sql<{ i: number }>`SELECT ${i}::int AS i, pg_sleep(0.1)`))
      // Both live connections run a statement and the server refused the new ones: the rest wait.
      for (;;) {
        const [{ running }] = await hogs[0]!<{ running: number }[]>`SELECT count(*)::int AS running FROM pg_stat_activity WHERE application_name = 'fencegate' AND query LIKE '%pg_sleep(0.1)%' AND state = 'active'`
        if (running === 2 && refusedSoFar(cluster.log) - before >= 4) break
      }
      await hogs[0]!`SELECT 1`
      // Not scheduled: the two statements end and the stall timer falls due meanwhile; each
      // statement after is far shorter than the connect timeout, so no waiter has cause to fail.
      const until = performance.now() + 1000
      while (performance.now() < until) { /* the process held, as a throttled container is */ }
      const results = await burst
      expect(results.map((r) => r.status === 'fulfilled' ? r.value[0]!.i : (r.reason as StoreError).sqlstate ?? (r.reason as StoreError).driverCode))
        .toEqual([0, 1, 2, 3, 4, 5])
    } finally {
      await db.close()
    }
  })

  it('fails the waiting statements with 53300 once a connect timeout passes with none served', async () => {
    const db = connectPostgres(cluster.url, { max: 20, connectTimeoutMs: 300 })
    try {
      await takeSlots(1)
      await db.sql`SELECT 1`
      // The one live connection is busy for far longer than the connect timeout.
      const long = db.sql`SELECT pg_sleep(5)`
      const results = await Promise.allSettled(Array.from({ length: 5 }, () => db.sql`SELECT 1`))
      for (const r of results) {
        const err = (r as PromiseRejectedResult).reason
        expect([r.status, err instanceof StoreError, (err as StoreError).sqlstate]).toEqual(['rejected', true, '53300'])
      }
      await long
    } finally {
      await db.close()
    }
  })

  it('keeps postgres.js\'s fail-over for a URL of several hosts: a refusing host is passed over', async () => {
    const refusing = await freePort()
    const db = connectPostgres(`postgres://postgres@127.0.0.1:${refusing},127.0.0.1:${cluster.port}/postgres`, { max: 2 })
    try {
      const rows = await Promise.all(Array.from({ length: 4 }, () => db.sql<{ port: number }>`SELECT inet_server_port() AS port`))
      expect(rows.map((r) => r[0]!.port)).toEqual([cluster.port, cluster.port, cluster.port, cluster.port])
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
