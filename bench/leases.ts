// `npm run bench -- leases`: claim → heartbeat → complete with N concurrent workers, over
// HTTP against a gateway process on PostgreSQL, and the same workload in the same run
// directly against the store (createJobStore in this process, no HTTP), for the ratio.
// Every phase works a fixed number of jobs seeded beforehand and ends when the queue is
// empty, so each loop is bounded by the job count.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { availableParallelism, cpus, loadavg, tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import { Pool } from 'undici'
import { parseConfig } from '../src/config/schema.js'
import { createJobStore, type JobStore } from '../src/leases/store.js'
import type { Db } from '../src/store/db.js'
import { connectPostgres } from '../src/store/postgres.js'
import { parseOptions, recommendedGatewayNodeOptions } from './options.js'
import { cpuBetween, cpuSeconds, freePort, isHealthy, postgresCpu, startChild, stopChild, waitUntil, type Child } from './procs.js'
import { prepareStore, type BenchStore } from './store.js'

const flags = {
  workers: { type: 'string', help: 'concurrent workers in each phase (default 20)' },
  jobs: { type: 'string', help: 'jobs each measured phase works through (default 3000)' },
  rounds: { type: 'string', help: 'measured rounds, each one store phase then one HTTP phase (default 2)' },
  'database-url': { type: 'string', help: 'PostgreSQL database to use as-is (else DATABASE_URL; else a fresh one is created and dropped)' },
  'admin-url': { type: 'string', help: 'where that fresh database is created (default postgres://postgres@127.0.0.1:5432/test)' },
  help: { type: 'boolean', help: 'show this help' },
} as const

function usage(): string {
  const lines = ['usage: npm run bench -- leases [options]', '', 'claim → heartbeat → complete throughput, over HTTP and directly against the store.', '', 'options:']
  for (const [name, f] of Object.entries(flags)) lines.push(`  --${name}${f.type === 'string' ? ' <value>' : ''}`.padEnd(28) + f.help)
  return lines.join('\n')
}

function integer(value: unknown, name: string, fallback: number, min: number, max: number): number {
  if (value === undefined) return fallback
  if (typeof value !== 'string' || !/^\d+$/.test(value) || Number(value) < min || Number(value) > max) throw new Error(`--${name} must be an integer from ${min} to ${max}`)
  return Number(value)
}

/** One worker's view of the lease API: the same three steps over HTTP or on the store. */
interface Steps {
  claim(worker: string): Promise<{ jobId: string; fence: string } | undefined>
  heartbeat(worker: string, jobId: string, fence: string): Promise<boolean>
  complete(worker: string, jobId: string, fence: string): Promise<boolean>
}

const jobType = { name: 'bench', lease: '60s', max_attempts: 3 }
const types = parseConfig({ routes: [{ name: 'unused', method: 'POST', path: '/unused', upstream: 'http://127.0.0.1:9', fence: 'off' }], job_types: [jobType] }).job_types

function storeSteps(jobs: JobStore): Steps {
  const holder = (workerId: string, jobId: string, fence: string) => ({ tenant: 'default', workerId, jobId, fence })
  return {
    async claim(workerId) {
      // A claim that finished a job instead (out of attempts) returns it too; none happens here, but skip it like the API does.
      for (let i = 0; i < 100; i++) {
        const c = await jobs.claimOne({ tenant: 'default', workerId, types })
        if (!c) return undefined
        if (c.state === 'running') return { jobId: c.job_id, fence: c.fence }
      }
      return undefined
    },
    heartbeat: async (w, id, fence) => (await jobs.heartbeat(holder(w, id, fence), types)) !== undefined,
    complete: async (w, id, fence) => {
      const r = await jobs.complete(holder(w, id, fence), { ok: true }, { requestId: 'bench', caller: null, path: 'bench' })
      return r.completed
    },
  }
}

function httpSteps(pool: Pool): Steps {
  const post = async (path: string, body: unknown) => {
    const res = await pool.request({ path: `/_fencegate/jobs${path}`, method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) })
    const text = await res.body.text()
    return { status: res.statusCode, json: text ? JSON.parse(text) : undefined }
  }
  return {
    async claim(worker_id) {
      const r = await post('/claim', { worker_id, types: ['bench'] })
      if (r.status === 204) return undefined
      if (r.status !== 200) throw new Error(`claim answered ${r.status}`)
      return { jobId: r.json.job_id, fence: r.json.fence }
    },
    heartbeat: async (worker_id, id, fence) => (await post(`/${id}/heartbeat`, { worker_id, fence })).status === 200,
    complete: async (worker_id, id, fence) => (await post(`/${id}/complete`, { worker_id, fence, result: { ok: true } })).status === 200,
  }
}

interface Phase {
  name: string
  jobs: number
  seconds: number
  latencies: Record<'claim' | 'heartbeat' | 'complete', number[]>
  refused: number
  cpu: { gateway: number; postgres: number; bench: number }
}

/** Seeds `count` jobs (not measured), then lets `workers` work until the queue is empty. */
async function phase(name: string, steps: Steps, seed: JobStore, db: Db, o: { workers: number; count: number; prefix: string; signal: AbortSignal; gateway?: Child }): Promise<Phase> {
  let next = 0
  await Promise.all(Array.from({ length: 20 }, async () => {
    while (next < o.count && !o.signal.aborted) await seed.startJob({ tenant: 'default', type: 'bench', key: `${o.prefix}.${next++}`, payload: { bench: true }, restart: false })
  }))
  const latencies: Phase['latencies'] = { claim: [], heartbeat: [], complete: [] }
  let refused = 0
  const timed = async <T>(op: keyof Phase['latencies'], run: () => Promise<T>): Promise<T> => {
    const t0 = performance.now()
    const v = await run()
    latencies[op].push(performance.now() - t0)
    return v
  }
  const before = { at: performance.now(), gw: o.gateway ? cpuSeconds(o.gateway.pid) : 0, pg: postgresCpu(), self: process.cpuUsage() }
  await Promise.all(Array.from({ length: o.workers }, async (_, w) => {
    const worker = `${o.prefix}.w${w}`
    // Bounded: each pass completes a job or ends the worker; the slack covers refusals.
    for (let i = 0; i <= o.count && !o.signal.aborted; i++) {
      const claimed = await timed('claim', () => steps.claim(worker))
      if (!claimed) return
      if (!(await timed('heartbeat', () => steps.heartbeat(worker, claimed.jobId, claimed.fence)))) refused++
      if (!(await timed('complete', () => steps.complete(worker, claimed.jobId, claimed.fence)))) refused++
    }
  }))
  if (o.signal.aborted) throw new Error('interrupted')
  const seconds = (performance.now() - before.at) / 1000
  const self = process.cpuUsage(before.self)
  const cpu = {
    gateway: o.gateway ? (cpuSeconds(o.gateway.pid) - before.gw) / seconds : 0,
    postgres: cpuBetween(before.pg, postgresCpu()) / seconds,
    bench: (self.user + self.system) / 1e6 / seconds,
  }
  const [done] = await db.sql<{ succeeded: number; other: number; reclaimed: number }>`
    SELECT count(*) FILTER (WHERE state = 'succeeded')::int AS succeeded, count(*) FILTER (WHERE state <> 'succeeded')::int AS other,
           count(*) FILTER (WHERE attempt <> 1 OR fence <> 1)::int AS reclaimed
    FROM fg_jobs WHERE key LIKE ${`${o.prefix}.%`}`
  if (done!.succeeded !== o.count || done!.other !== 0 || done!.reclaimed !== 0 || refused !== 0) {
    throw new Error(`${name}: expected ${o.count} jobs succeeded once each, found ${JSON.stringify(done)} and ${refused} refused steps`)
  }
  return { name, jobs: o.count, seconds, latencies, refused, cpu }
}

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] ?? NaN
}

function line(p: Phase): string {
  const lat = (['claim', 'heartbeat', 'complete'] as const).map((op) => `${pct(p.latencies[op], 50).toFixed(2)}/${pct(p.latencies[op], 99).toFixed(2)}`).join(' | ')
  const cpu = `${p.cpu.gateway.toFixed(2)} | ${p.cpu.postgres.toFixed(2)} | ${p.cpu.bench.toFixed(2)}`
  return `| ${p.name} | ${p.jobs} | ${p.seconds.toFixed(2)} | ${(p.jobs / p.seconds).toFixed(0)} | ${lat} | ${cpu} |`
}

/** Runs the leases bench; resolves to the process exit code. */
export async function runLeasesBench(argv: string[]): Promise<number> {
  let values: Record<string, unknown>
  let workers: number, count: number, rounds: number
  try {
    values = parseArgs({ args: argv, options: Object.fromEntries(Object.entries(flags).map(([k, f]) => [k, { type: f.type }])), strict: true }).values
    workers = integer(values.workers, 'workers', 20, 1, 500)
    count = integer(values.jobs, 'jobs', 3000, 1, 1_000_000)
    rounds = integer(values.rounds, 'rounds', 2, 1, 10)
  } catch (err) {
    console.error(`bench leases: ${(err as Error).message}\n\n${usage()}`)
    return 2
  }
  if (values.help) {
    console.log(usage())
    return 0
  }
  const passOn = (['database-url', 'admin-url'] as const).flatMap((k) => (typeof values[k] === 'string' ? [`--${k}`, values[k] as string] : []))
  const options = parseOptions(['--store', 'postgres', ...passOn], process.env)!
  const interrupted = new AbortController()
  const interrupt = () => interrupted.abort()
  process.once('SIGINT', interrupt)
  let gateway: Child | undefined
  // A last resort so the bench always ends (the throwaway database is then left behind).
  const watchdog = setTimeout(() => {
    console.error('bench leases: still running after 15 minutes; giving up')
    gateway?.process.kill('SIGKILL')
    process.exit(1)
  }, 15 * 60_000)
  watchdog.unref()
  const tmp = mkdtempSync(join(tmpdir(), 'fencegate-bench-leases-'))
  let store: BenchStore | undefined
  let db: Db | undefined
  let pool: Pool | undefined
  try {
    store = await prepareStore(options)
    const url = store.gatewayEnv({}).DATABASE_URL!
    console.log(`machine: ${availableParallelism()} cores (${cpus()[0]?.model ?? 'unknown'}), node ${process.version}, load average ${loadavg().map((l) => l.toFixed(2)).join(' ')}`)
    console.log(`store: ${store.description} at ${store.location}`)
    console.log(`workload: ${workers} workers, ${count} jobs per phase, ${rounds} round(s) of store then HTTP, after one discarded warm-up round`)
    const [port, adminPort] = [await freePort(), await freePort()]
    const configFile = join(tmp, 'fencegate.leases.yaml')
    writeFileSync(configFile, JSON.stringify({
      server: { host: '127.0.0.1', port, admin_host: '127.0.0.1', admin_port: adminPort },
      log: { level: 'warn' },
      routes: [{ name: 'unused', method: 'POST', path: '/unused', upstream: 'http://127.0.0.1:9', fence: 'off' }],
      job_types: [jobType],
    }))
    gateway = startChild('gateway', new URL('../src/cli/main.js', import.meta.url), ['serve', '--config', configFile], store.gatewayEnv(process.env), recommendedGatewayNodeOptions)
    await waitUntil(gateway, 'healthy', () => isHealthy(`http://127.0.0.1:${adminPort}/health`), 60_000)
    // The same pool size as the gateway's own (connectPostgres' default), so both sides get equal connections.
    db = connectPostgres(url)
    const jobs = createJobStore(db)
    pool = new Pool(`http://127.0.0.1:${port}`, { connections: workers, headersTimeout: 30_000, bodyTimeout: 30_000 })
    const direct = storeSteps(jobs)
    const http = httpSteps(pool)
    const tag = Date.now().toString(36)
    const warm = Math.min(count, 300)
    const signal = interrupted.signal
    await phase('warm-up store', direct, jobs, db, { workers, count: warm, prefix: `${tag}.ws`, signal })
    await phase('warm-up http', http, jobs, db, { workers, count: warm, prefix: `${tag}.wh`, signal, gateway })
    const results: Phase[] = []
    for (let r = 1; r <= rounds; r++) {
      results.push(await phase(`store ${r}`, direct, jobs, db, { workers, count, prefix: `${tag}.s${r}`, signal }))
      results.push(await phase(`http ${r}`, http, jobs, db, { workers, count, prefix: `${tag}.h${r}`, signal, gateway }))
    }
    console.log('\n| phase | jobs | s | jobs/s | claim p50/p99 ms | heartbeat p50/p99 ms | complete p50/p99 ms | CPU gateway \\| postgres \\| bench (cores) |')
    console.log('|---|---:|---:|---:|---|---|---|---|')
    for (const p of results) console.log(line(p))
    const rate = (p: Phase) => p.jobs / p.seconds
    for (let r = 0; r < rounds; r++) {
      console.log(`round ${r + 1}: HTTP reaches ${((100 * rate(results[2 * r + 1]!)) / rate(results[2 * r]!)).toFixed(0)}% of the store's jobs/s`)
    }
    console.log(`every phase: all ${count} jobs succeeded, each claimed once (attempt 1, fence 1), no step refused; load average at the end ${loadavg().map((l) => l.toFixed(2)).join(' ')}`)
    return 0
  } catch (err) {
    if (!interrupted.signal.aborted) throw err
    console.error('bench leases: interrupted')
    return 130
  } finally {
    process.off('SIGINT', interrupt)
    await pool?.close()
    await db?.close()
    if (gateway) await stopChild(gateway)
    await store?.cleanup().catch((err: unknown) => console.error(`bench leases: cleanup failed: ${(err as Error).message}`))
    rmSync(tmp, { recursive: true, force: true })
    clearTimeout(watchdog)
  }
}
