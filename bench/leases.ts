// `npm run bench -- leases`: fencegate's lease service side by side with graphile-worker,
// in one run on one PostgreSQL server, each system on a fresh database of its own.
// No-op jobs, `--concurrency` in flight, drained from a backlog seeded beforehand at each
// `--depths` (seeding is not measured), then a steady regime where producers keep about
// `--backlog` jobs waiting. Reported: jobs/s and CPU µs per job of this process (the
// workers, and the producers in the steady regime), the gateway, and the PostgreSQL
// backends of the system's database (/proc/<pid>/stat).
import { mkdtempSync, rmSync } from 'node:fs'
import { availableParallelism, cpus, loadavg, tmpdir } from 'node:os'
import { join } from 'node:path'
import { parseArgs } from 'node:util'
import postgres from 'postgres'
import { Pool } from 'undici'
import { parseConfig } from '../src/config/schema.js'
import { createJobStore } from '../src/leases/store.js'
import type { Db } from '../src/store/db.js'
import { connectPostgres } from '../src/store/postgres.js'
import { fencegateSystem, graphileSystem, httpSteps, jobTypeName, storeSteps, type System } from './lease-systems.js'
import { backendCpu, backendCpuBetween, type BackendCpu } from './pg-cpu.js'
import { cpuSeconds } from './procs.js'
import { benchTokens, startLeaseGateway, type LeaseGateway } from './lease-gateway.js'
import { prepareStore, type BenchStore } from './fresh-db.js'

const systemNames = ['store', 'store-batch', 'http', 'http-jwt', 'http-batch', 'graphile'] as const
type SystemName = (typeof systemNames)[number]

const flags = {
  depths: { type: 'string', help: 'queue depths to drain, comma-separated (default 1000,20000,100000)' },
  'steady-jobs': { type: 'string', help: 'jobs in the steady regime; 0 skips it (default 20000)' },
  rounds: { type: 'string', help: 'measured rounds; the table shows medians (default 3)' },
  concurrency: { type: 'string', help: 'jobs in flight at most, for every system (default 20)' },
  batch: { type: 'string', help: 'jobs per claim in the *-batch systems (default 10)' },
  producers: { type: 'string', help: 'producers in the steady regime (default 20)' },
  backlog: { type: 'string', help: 'jobs the steady producers keep waiting at most (default 200)' },
  systems: { type: 'string', help: `systems to run (default ${systemNames.join(',')})` },
  'admin-url': { type: 'string', help: 'where the fresh databases are created (default postgres://postgres@127.0.0.1:5432/test)' },
  help: { type: 'boolean', help: 'show this help' },
} as const

function usage(): string {
  const lines = ['usage: npm run bench -- leases [options]', '', 'fencegate job claims side by side with graphile-worker, at several queue depths and steady.', '', 'options:']
  for (const [name, f] of Object.entries(flags)) lines.push(`  --${name}${f.type === 'string' ? ' <value>' : ''}`.padEnd(28) + f.help)
  lines.push('', 'a short check: npm run bench -- leases --depths 200,1000 --steady-jobs 500 --rounds 1')
  return lines.join('\n')
}

function integer(value: unknown, name: string, fallback: number, min: number, max: number): number {
  if (value === undefined) return fallback
  if (typeof value !== 'string' || !/^\d+$/.test(value) || Number(value) < min || Number(value) > max) throw new Error(`--${name} must be an integer from ${min} to ${max}`)
  return Number(value)
}

interface Options {
  depths: number[]
  steadyJobs: number
  rounds: number
  concurrency: number
  batch: number
  producers: number
  backlog: number
  systems: SystemName[]
  adminUrl: string | undefined
}

function parse(argv: string[]): Options | undefined {
  const { values } = parseArgs({ args: argv, options: Object.fromEntries(Object.entries(flags).map(([k, f]) => [k, { type: f.type }])), strict: true })
  if (values.help) return undefined
  const list = (v: unknown, fallback: string) => (typeof v === 'string' ? v : fallback).split(',').map((s) => s.trim()).filter((s) => s !== '')
  const systems = list(values.systems, systemNames.join(','))
  for (const s of systems) if (!(systemNames as readonly string[]).includes(s)) throw new Error(`--systems: unknown system ${JSON.stringify(s)} (known: ${systemNames.join(', ')})`)
  return {
    depths: list(values.depths, '1000,20000,100000').map((d) => integer(d, 'depths', 0, 1, 1_000_000)),
    steadyJobs: integer(values['steady-jobs'], 'steady-jobs', 20_000, 0, 1_000_000),
    rounds: integer(values.rounds, 'rounds', 3, 1, 10),
    concurrency: integer(values.concurrency, 'concurrency', 20, 1, 200),
    batch: integer(values.batch, 'batch', 10, 1, 100),
    producers: integer(values.producers, 'producers', 20, 1, 200),
    backlog: integer(values.backlog, 'backlog', 200, 1, 100_000),
    systems: systemNames.filter((n) => systems.includes(n)),
    adminUrl: typeof values['admin-url'] === 'string' ? values['admin-url'] : undefined,
  }
}

interface Phase {
  regime: string
  system: string
  jobs: number
  seconds: number
  /** CPU seconds over the phase. */
  cpu: { bench: number; gateway: number; postgres: number }
}

async function measure(system: System, regime: string, jobs: number, cpu: BackendCpu, run: () => Promise<number>): Promise<Phase> {
  const before = { at: performance.now(), self: process.cpuUsage(), gw: system.gatewayPid ? cpuSeconds(system.gatewayPid) : 0, pg: await cpu.snapshot(system.database) }
  const refused = await run()
  const seconds = (performance.now() - before.at) / 1000
  const self = process.cpuUsage(before.self)
  const after = { gw: system.gatewayPid ? cpuSeconds(system.gatewayPid) : 0, pg: await cpu.snapshot(system.database) }
  if (refused !== 0) throw new Error(`${system.name}, ${regime}: ${refused} completions refused`)
  return { regime, system: system.name, jobs, seconds, cpu: { bench: (self.user + self.system) / 1e6, gateway: after.gw - before.gw, postgres: backendCpuBetween(before.pg, after.pg) } }
}

async function phase(system: System, o: Options, regime: string, depth: number | undefined, prefix: string, cpu: BackendCpu, signal: AbortSignal, watch: (jobs: number) => void): Promise<Phase> {
  await system.reset()
  const total = depth ?? o.steadyJobs
  watch(total)
  if (depth) await system.seed(depth, prefix)
  const steady = depth ? undefined : { producers: o.producers, backlog: o.backlog }
  const p = await measure(system, regime, total, cpu, () => system.work({ total, concurrency: o.concurrency, signal, ...(steady ? { steady } : {}) }, prefix))
  if (signal.aborted) throw new Error('interrupted')
  await system.verify(total, prefix)
  return p
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
}

function report(phases: Phase[], rounds: number): string[] {
  const lines = [`| regime | system | jobs | jobs/s | CPU µs per job: bench process | gateway | PostgreSQL | total |`, '|---|---|---:|---:|---:|---:|---:|---:|']
  const groups = new Map<string, Phase[]>()
  for (const p of phases) groups.set(`${p.regime}\u0000${p.system}`, [...(groups.get(`${p.regime}\u0000${p.system}`) ?? []), p])
  const rate = new Map<string, number>()
  const pgPerJob = new Map<string, number>()
  for (const [key, ps] of groups) {
    const [regime, system] = key.split('\u0000') as [string, string]
    const perJob = (f: (p: Phase) => number) => median(ps.map((p) => (1e6 * f(p)) / p.jobs))
    const jobsPerSecond = median(ps.map((p) => p.jobs / p.seconds))
    const [bench, gateway, pgUs] = [perJob((p) => p.cpu.bench), perJob((p) => p.cpu.gateway), perJob((p) => p.cpu.postgres)]
    rate.set(key, jobsPerSecond)
    pgPerJob.set(key, pgUs)
    const us = (v: number) => v.toFixed(0)
    lines.push(`| ${regime} | ${system} | ${ps[0]!.jobs} | ${jobsPerSecond.toFixed(0)} | ${us(bench)} | ${gateway ? us(gateway) : '–'} | ${us(pgUs)} | ${us(perJob((p) => p.cpu.bench + p.cpu.gateway + p.cpu.postgres))} |`)
  }
  lines.push('', `medians of ${rounds} round(s); jobs/s relative to graphile-worker in the same regime:`)
  const regimes = [...new Set(phases.map((p) => p.regime))]
  const systems = [...new Set(phases.map((p) => p.system))]
  const graphile = systems.find((s) => s.startsWith('graphile'))
  for (const regime of regimes) {
    const base = graphile ? rate.get(`${regime}\u0000${graphile}`) : undefined
    if (base) lines.push(`  ${regime}: ${systems.filter((s) => s !== graphile).map((s) => `${s} ${((100 * (rate.get(`${regime}\u0000${s}`) ?? 0)) / base).toFixed(0)}%`).join(', ')}`)
  }
  const depthRegimes = regimes.filter((r) => r.startsWith('depth'))
  if (depthRegimes.length > 1) {
    const [first, last] = [depthRegimes[0]!, depthRegimes.at(-1)!]
    lines.push(`PostgreSQL CPU per job at ${last} relative to ${first}: ${systems.map((s) => `${s} ${((pgPerJob.get(`${last}\u0000${s}`) ?? 0) / (pgPerJob.get(`${first}\u0000${s}`) ?? 1)).toFixed(2)}x`).join(', ')}`)
  }
  return lines
}

async function freshDatabase(adminUrl: string, name: string): Promise<{ url: string; drop(): Promise<void> }> {
  const admin = postgres(adminUrl, { max: 1, connect_timeout: 5, onnotice: () => {} })
  try {
    await admin.unsafe(`CREATE DATABASE ${name}`)
  } finally {
    await admin.end({ timeout: 5 })
  }
  const u = new URL(adminUrl)
  u.pathname = `/${name}`
  return {
    url: u.toString(),
    async drop() {
      const a = postgres(adminUrl, { max: 1, connect_timeout: 5, onnotice: () => {} })
      try {
        await a.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
      } finally {
        await a.end({ timeout: 5 })
      }
    },
  }
}

const jobType = { name: jobTypeName, lease: '60s', max_attempts: 3 }
const unusedRoute = { name: 'unused', method: 'POST', path: '/unused', upstream: 'http://127.0.0.1:9', fence: 'off' }

/** Runs the leases bench; resolves to the process exit code. */
export async function runLeasesBench(argv: string[]): Promise<number> {
  let o: Options | undefined
  try {
    o = parse(argv)
  } catch (err) {
    console.error(`bench leases: ${(err as Error).message}\n\n${usage()}`)
    return 2
  }
  if (!o) {
    console.log(usage())
    return 0
  }
  const interrupted = new AbortController()
  const interrupt = () => interrupted.abort()
  process.once('SIGINT', interrupt)
  const tmp = mkdtempSync(join(tmpdir(), 'fencegate-bench-leases-'))
  const cleanups: (() => Promise<unknown>)[] = []
  // A phase that stops making progress (a bug, a dead server) ends the bench instead of hanging it.
  let stalled: NodeJS.Timeout | undefined
  const watch = (jobs: number) => {
    clearTimeout(stalled)
    stalled = setTimeout(() => {
      console.error('bench leases: a phase ran far longer than its job count allows; giving up')
      interrupted.abort()
    }, (300 + jobs / 20) * 1000)
  }
  try {
    const adminUrl = o.adminUrl ?? process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test'
    const store: BenchStore = await prepareStore(adminUrl)
    cleanups.push(() => store.cleanup())
    const url = store.url
    const fgDatabase = new URL(url).pathname.slice(1)
    const types = parseConfig({ routes: [unusedRoute], job_types: [jobType] }).job_types
    console.log(`machine: ${availableParallelism()} cores (${cpus()[0]?.model ?? 'unknown'}), node ${process.version}, load average ${loadavg().map((l) => l.toFixed(2)).join(' ')}`)
    console.log(`store: ${store.description}; fencegate on ${store.location}`)
    console.log(`workload: no-op jobs, ${o.concurrency} in flight, depths ${o.depths.join(', ')}${o.steadyJobs ? `, steady ${o.steadyJobs} jobs (${o.producers} producers, backlog ${o.backlog})` : ''}, batch ${o.batch}, ${o.rounds} round(s) after a discarded warm-up`)
    const gatewayConfig = { routes: [unusedRoute], job_types: [jobType] }
    const gateway = await startLeaseGateway(tmp, store, o.concurrency, gatewayConfig, false)
    cleanups.unshift(() => gateway.stop())
    // Under auth (http-jwt): the same job API, each call with a token the gateway verifies and checks.
    const jwtGateway = o.systems.includes('http-jwt') ? await startLeaseGateway(tmp, store, o.concurrency, gatewayConfig, true) : undefined
    if (jwtGateway) cleanups.unshift(() => jwtGateway.stop())
    // The same pool size as the gateway's (its config above) and graphile-worker's, so every system gets equal connections.
    const db: Db = connectPostgres(url, { max: o.concurrency })
    cleanups.unshift(() => db.close())
    // As the gateway wires it: the completions of one event-loop turn share a statement.
    const jobs = createJobStore(db, { schedule: setImmediate })
    const poolOf = (port: number) => {
      const pool = new Pool(`http://127.0.0.1:${port}`, { connections: o.concurrency, headersTimeout: 30_000, bodyTimeout: 30_000 })
      cleanups.unshift(() => pool.close())
      return pool
    }
    const pool = poolOf(gateway.port)
    const cpu = backendCpu(adminUrl)
    cleanups.unshift(() => cpu.close())
    const systems: System[] = []
    const fg = (name: string, steps: ReturnType<typeof storeSteps>, batch: number, http?: LeaseGateway) =>
      fencegateSystem({ name, database: fgDatabase, db, steps, batch, longPoll: http !== undefined, ...(http ? { gatewayPid: http.child.pid } : {}) })
    for (const name of o.systems) {
      if (name === 'store') systems.push(fg('fencegate store, 1 per claim', storeSteps(jobs, types), 1))
      if (name === 'store-batch') systems.push(fg(`fencegate store, ${o.batch} per claim`, storeSteps(jobs, types), o.batch))
      if (name === 'http') systems.push(fg('fencegate HTTP, 1 per claim', httpSteps(pool), 1, gateway))
      if (name === 'http-jwt') systems.push(fg('fencegate HTTP under auth.mode: jwt, 1 per claim', httpSteps(poolOf(jwtGateway!.port), benchTokens()), 1, jwtGateway))
      if (name === 'http-batch') systems.push(fg(`fencegate HTTP, ${o.batch} per claim`, httpSteps(pool), o.batch, gateway))
      if (name === 'graphile') {
        const graphileDb = await freshDatabase(adminUrl, `graphile_bench_${Date.now()}`)
        cleanups.push(() => graphileDb.drop())
        const g = await graphileSystem({ url: graphileDb.url, database: new URL(graphileDb.url).pathname.slice(1), connections: o.concurrency })
        cleanups.unshift(() => g.close())
        systems.push(g)
      }
    }
    const signal = interrupted.signal
    const tag = Date.now().toString(36)
    for (const s of systems) await phase(s, o, 'warm-up', Math.min(300, o.depths[0] ?? 300), `${tag}.warm`, cpu, signal, watch)
    const phases: Phase[] = []
    for (let r = 1; r <= o.rounds; r++) {
      for (const depth of o.depths) {
        for (const s of systems) phases.push(await phase(s, o, `depth ${depth}`, depth, `${tag}.r${r}.d${depth}`, cpu, signal, watch))
      }
      if (o.steadyJobs) for (const s of systems) phases.push(await phase(s, o, 'steady', undefined, `${tag}.r${r}.s`, cpu, signal, watch))
      console.log(`round ${r} done; load average ${loadavg().map((l) => l.toFixed(2)).join(' ')}`)
    }
    console.log(['', ...report(phases, o.rounds)].join('\n'))
    console.log(`every phase: each job ran and completed exactly once; load average at the end ${loadavg().map((l) => l.toFixed(2)).join(' ')}`)
    return 0
  } catch (err) {
    if (!interrupted.signal.aborted) throw err
    console.error('bench leases: interrupted')
    return 130
  } finally {
    process.off('SIGINT', interrupt)
    clearTimeout(stalled)
    // Pools first, then the gateway, then the databases it used.
    for (const c of cleanups.splice(0)) await c().catch((err: unknown) => console.error(`bench leases: cleanup failed: ${(err as Error).message}`))
    rmSync(tmp, { recursive: true, force: true })
  }
}
