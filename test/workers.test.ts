import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { postgresBinaries, startCluster, type Cluster } from './helpers/cluster.js'
import { post } from './helpers/gateway.js'
import { runCli, startGatewayProcess, writeConfig, type GatewayProcess } from './helpers/process.js'
import { closedPort, startKeyCountingUpstream } from './helpers/upstream.js'
import { restartBackoff } from '../src/runtime/node/supervisor.js'

/**
 * `fencegate serve --workers 2`: one supervisor, two worker processes on the same ports and
 * the same store (a throwaway PostgreSQL cluster of this file's own). Real processes, real
 * concurrency; waits are bounded polls on what must happen, never sleeps.
 */
const bin = postgresBinaries()

async function until<T>(what: string, check: () => Promise<T | undefined>, tries = 400): Promise<T> {
  for (let i = 0; ; i++) {
    const value = await check().catch(() => undefined)
    if (value !== undefined) return value
    if (i >= tries) throw new Error(`never: ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

const health = async (gw: GatewayProcess) => (await fetch(`${gw.adminUrl}/health`)).json() as Promise<{ status: string; workers?: number }>
const workerPids = (gw: GatewayProcess) => [...new Set(gw.lines.map((l) => JSON.parse(l) as { event: string; pid?: number }).filter((l) => l.event === 'listening').map((l) => l.pid!))]
const alive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

describe('the restart backoff (docs/operations.md#several-workers)', () => {
  it('waits 100 ms after a first death, doubles to at most 5 s, and starts over once a worker ran 10 s', () => {
    let failures = 0
    const delays = Array.from({ length: 8 }, () => {
      const next = restartBackoff(failures, 50)
      failures = next.failures
      return next.delayMs
    })
    expect(delays).toEqual([100, 200, 400, 800, 1600, 3200, 5000, 5000])
    expect(restartBackoff(failures, 10_001)).toEqual({ failures: 1, delayMs: 100 })
  })
})

describe.skipIf(!bin)('a gateway of two workers', () => {
  let cluster: Cluster
  let upstream: Awaited<ReturnType<typeof startKeyCountingUpstream>>
  let gw: GatewayProcess
  let executions = new Map<string, number>()

  beforeAll(async () => {
    cluster = await startCluster(bin!)
    upstream = await startKeyCountingUpstream()
    executions = upstream.executions
    const config = writeConfig({
      server: { port: 0, admin_port: 0, workers: 2 },
      store: { max_connections: 8 },
      routes: [{ name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream: upstream.url, entity: 'invoice:{params.id}', fence: 'required', idempotency: 'optional' }],
    })
    gw = await startGatewayProcess(['--config', config, '--database-url', cluster.url])
    await until('both workers live', async () => ((await health(gw)).workers === 2 ? true : undefined))
  }, 120_000)
  afterAll(async () => {
    await gw?.stop()
    await upstream?.close()
    cluster?.destroy()
  })

  it('keeps one fence order across workers and executes each key once', async () => {
    // 10 entities; per entity, fences 1..10 each sent twice at once with the same key.
    const sends = Array.from({ length: 10 }, (_, e) => Array.from({ length: 10 }, (_, f) => [e, f + 1] as const)).flat()
    const answers = await Promise.all(sends.flatMap(([e, f]) => [0, 1].map(() => post(`${gw.dataUrl}/payments/${e}/capture`, String(f), { headers: { 'idempotency-key': `k-${e}-${f}` } }))))
    expect(answers.every((a) => [200, 409].includes(a.status)), JSON.stringify(answers.filter((a) => ![200, 409].includes(a.status)).map((a) => a.json))).toBe(true)
    for (const [key, n] of executions) expect(n, key).toBe(1)
    // Per entity, nothing below the highest accepted fence is accepted afterwards.
    for (let e = 0; e < 10; e++) {
      const stale = await post(`${gw.dataUrl}/payments/${e}/capture`, '5', { headers: { 'idempotency-key': `late-${e}` } })
      expect(stale.status).toBe(409)
    }
    // Both workers served: each logs its own request lines.
    const served = new Set(gw.lines.map((l) => JSON.parse(l) as { event: string; worker?: number }).filter((l) => l.event === 'request').map((l) => l.worker))
    expect(served).toEqual(new Set([0, 1]))
  })

  it('sums the workers\' counters in /metrics, whichever worker is scraped', async () => {
    const text = await (await fetch(`${gw.adminUrl}/metrics`)).text()
    const total = [...text.matchAll(/^fencegate_requests_total\{[^}]*\} (\d+)/gm)].reduce((n, m) => n + Number(m[1]), 0)
    // Every data-plane request of this file so far (the first test's 210), from both workers.
    expect(total).toBe(210)
    expect(text).toMatch(/^fencegate_store_durability\{level="local"\} 1$/m)
  })

  it('a rule change made through one worker reaches the other', async () => {
    const rule = { name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream: upstream.url, entity: 'invoice:{params.id}', fence: 'off' }
    const put = await fetch(`${gw.adminUrl}/rules/capture`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify(rule) })
    expect(put.status).toBe(200)
    // Unfenced commands are accepted by both workers once each has the new rule (a fenced
    // route answered 428 fence_required): 20 at once, over new connections, until all pass.
    const servedBy = await until('both workers on the new rule', async () => {
      const from = gw.lines.length
      const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => fetch(`${gw.dataUrl}/payments/r${i}/capture`, { method: 'POST', body: '{}', headers: { connection: 'close' } })))
      if (!answers.every((a) => a.status === 200)) return undefined
      const workers = new Set(gw.lines.slice(from).map((l) => JSON.parse(l) as { event: string; worker?: number }).filter((l) => l.event === 'request').map((l) => l.worker))
      return workers.size === 2 ? workers : undefined
    })
    expect(servedBy).toEqual(new Set([0, 1]))
    const back = await fetch(`${gw.adminUrl}/rules/capture`, { method: 'PUT', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...rule, fence: 'required', idempotency: 'optional' }) })
    expect(back.status).toBe(200)
    await until('both workers fenced again', async () => {
      const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => fetch(`${gw.dataUrl}/payments/r${i}/capture`, { method: 'POST', body: '{}', headers: { connection: 'close' } })))
      return answers.every((a) => a.status === 428) ? true : undefined
    })
  })

  it('restarts a worker that dies, and drains and stops every process on SIGTERM', async () => {
    const [first] = workerPids(gw)
    process.kill(first!, 'SIGKILL')
    const restarted = await until('a new worker', async () => workerPids(gw).find((p) => p !== first && !workerPids(gw).slice(0, 2).includes(p)))
    await until('two live workers again', async () => ((await health(gw)).workers === 2 ? true : undefined))
    expect(gw.lines.some((l) => JSON.parse(l).event === 'worker_exited')).toBe(true)
    expect((await post(`${gw.dataUrl}/payments/99/capture`, '1')).status).toBe(200)
    const pids = workerPids(gw).filter(alive)
    expect(pids).toContain(restarted)
    expect(await gw.stop()).toBe(0)
    // No orphans: every worker is gone with its supervisor.
    await until('workers gone', async () => (pids.every((p) => !alive(p)) ? true : undefined))
  })

  it('workers whose supervisor is killed drain and exit on their own', async () => {
    const config = writeConfig({
      server: { port: 0, admin_port: 0, workers: 2 }, store: { max_connections: 4 },
      routes: [{ name: 'c', method: 'POST', path: '/c/:id', upstream: upstream.url, entity: 'c:{params.id}', fence: 'required' }],
    })
    const orphaned = await startGatewayProcess(['--config', config, '--database-url', cluster.url])
    await until('both workers live', async () => ((await health(orphaned)).workers === 2 ? true : undefined))
    const pids = await until('two worker pids', async () => (workerPids(orphaned).length === 2 ? workerPids(orphaned) : undefined))
    orphaned.child.kill('SIGKILL')
    await until('workers gone', async () => (pids.every((p) => !alive(p)) ? true : undefined))
  })

  it('runs the purges in one worker, once per store.purge_interval for the whole gateway', async () => {
    const config = writeConfig({
      server: { port: 0, admin_port: 0, workers: 2 }, store: { max_connections: 4, purge_interval: '1s' }, log: { level: 'debug' },
      routes: [{ name: 'c', method: 'POST', path: '/c/:id', upstream: upstream.url, entity: 'c:{params.id}', fence: 'required' }],
    })
    const purging = await startGatewayProcess(['--config', config, '--database-url', cluster.url])
    try {
      await until('both workers live', async () => ((await health(purging)).workers === 2 ? true : undefined))
      const runs = () => purging.lines.map((l) => JSON.parse(l) as { event: string; worker?: number }).filter((l) => l.event === 'purge_ran')
      // Each worker's timer ticks every second; had both purged, four runs would hold both indexes.
      const seen = await until('four purge runs', async () => (runs().length >= 4 ? runs() : undefined), 600)
      expect(new Set(seen.map((r) => r.worker))).toEqual(new Set([0]))
    } finally {
      await purging.stop()
    }
  })

  it('stops the whole gateway when a worker cannot start, instead of restarting it forever', async () => {
    // A store nobody listens on: every worker fails before it ever served.
    const nobody = await closedPort()
    const config = writeConfig({ server: { port: 0, admin_port: 0, workers: 2 }, routes: [{ name: 'c', method: 'POST', path: '/c/:id', upstream: upstream.url, entity: 'c:{params.id}' }] })
    const res = await runCli(['serve', '--config', config, '--database-url', `postgres://postgres@127.0.0.1:${nobody}/none`])
    expect(res.code).toBe(1)
    const events = res.stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l) as { event: string; worker?: number })
    expect(events.filter((e) => e.event === 'worker_failed_to_start').length).toBeGreaterThanOrEqual(1)
    expect(events.some((e) => e.event === 'worker_exited')).toBe(false)
  })

  it('refuses several workers on the embedded store, naming server.workers', async () => {
    const config = writeConfig({ server: { port: 0, admin_port: 0, workers: 2 }, routes: [{ name: 'c', method: 'POST', path: '/c/:id', upstream: upstream.url, entity: 'c:{params.id}' }] })
    const res = await runCli(['serve', '--config', config])
    expect(res.code).not.toBe(0)
    expect(res.stderr).toContain('server.workers')
  })
})
