// `npm run bench -- leases`: fencegate's lease service side by side with graphile-worker,
// in one run on one PostgreSQL server, each system on a fresh database of its own.
// No-op jobs, `--concurrency` in flight, drained from a backlog seeded beforehand at each
// `--depths` (seeding is not measured), then a steady regime where producers keep about
// `--backlog` jobs waiting. The worker SDKs' rows (`sdk`, `py-sdk`, `py-sdk-async`,
// bench/lease-sdk.ts) run `work()` against the same gateway at each `--slots`. Reported:
// jobs/s and CPU µs per job of this process (the workers, and the producers in the steady
// regime; with a Python row's process), the gateway, and the PostgreSQL backends of the
// system's database (/proc/<pid>/stat).
import { mkdtempSync, rmSync } from 'node:fs'
import { availableParallelism, cpus, loadavg, tmpdir } from 'node:os'
import { join } from 'node:path'
import { pathToFileURL } from 'node:url'
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
import { baselineSystems, parseLeaseOptions, leaseUsage as usage, type LeaseOptions as Options, type SystemName } from './lease-options.js'
import { baselineRatios, prepareBaseline } from './lease-baseline.js'
import { isSdkSystem, pythonWorker, sdkCaseName, sdkPairs, sdkRatioLines, sdkSystem, tsSdkWorker } from './lease-sdk.js'

interface Phase {
  round: number
  regime: string
  system: string
  jobs: number
  seconds: number
  /** CPU seconds over the phase. */
  cpu: { bench: number; gateway: number; postgres: number }
}

async function measure(system: System, round: number, regime: string, jobs: number, cpu: BackendCpu, run: () => Promise<number>): Promise<Phase> {
  const of = (pid?: number) => (pid ? cpuSeconds(pid) : 0)
  const before = { at: performance.now(), self: process.cpuUsage(), gw: of(system.gatewayPid), worker: of(system.workerPid), pg: await cpu.snapshot(system.database) }
  const refused = await run()
  const seconds = (performance.now() - before.at) / 1000
  const self = process.cpuUsage(before.self)
  const after = { gw: of(system.gatewayPid), worker: of(system.workerPid), pg: await cpu.snapshot(system.database) }
  if (refused !== 0) throw new Error(`${system.name}, ${regime}: ${refused} completions refused`)
  const bench = (self.user + self.system) / 1e6 + after.worker - before.worker
  return { round, regime, system: system.name, jobs, seconds, cpu: { bench, gateway: after.gw - before.gw, postgres: backendCpuBetween(before.pg, after.pg) } }
}

async function phase(system: System, o: Options, round: number, regime: string, depth: number | undefined, prefix: string, cpu: BackendCpu, signal: AbortSignal, watch: (jobs: number) => void): Promise<Phase> {
  await system.reset()
  const total = depth ?? o.steadyJobs
  watch(total)
  if (depth) await system.seed(depth, prefix)
  const steady = depth ? undefined : { producers: o.producers, backlog: o.backlog }
  const p = await measure(system, round, regime, total, cpu, () => system.work({ total, concurrency: o.concurrency, signal, ...(steady ? { steady } : {}) }, prefix))
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
  const regimes = [...new Set(phases.map((p) => p.regime))]
  const systems = [...new Set(phases.map((p) => p.system))]
  const graphile = systems.find((s) => s.startsWith('graphile'))
  lines.push('', `medians of ${rounds} round(s)${graphile ? '; jobs/s relative to graphile-worker in the same regime:' : ''}`)
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

const httpNames: Partial<Record<SystemName, string>> = { http: 'fencegate HTTP, 1 per claim', 'http-jwt': 'fencegate HTTP under auth.mode: jwt, 1 per claim' }

/**
 * `--baseline <ref>`: that ref's build (a temporary worktree) serves http and http-jwt again,
 * with the same config and tokens, on a fresh database of its own that its gateway migrates.
 */
async function startBaseline(ref: string, o: Options, tmp: string, adminUrl: string, config: { routes: unknown[]; job_types: unknown[] }, cleanups: (() => Promise<unknown>)[], poolOf: (port: number) => Pool): Promise<Map<SystemName, System>> {
  console.log(`baseline: checking out and building ${ref} in a temporary worktree`)
  const b = await prepareBaseline(ref, join(tmp, 'baseline'))
  // Pushed, not unshifted: the worktree goes after the gateways running from it have stopped.
  cleanups.push(() => b.remove())
  const lock = b.lockDifferences.length ? `; of the packages its package-lock.json locks, this checkout's has other versions of: ${b.lockDifferences.join(', ')}` : '; its package-lock.json locks the same versions as this checkout\'s'
  console.log(`baseline: ${ref} = ${b.commit.slice(0, 12)}, run on this checkout's node_modules${lock}`)
  const store = await prepareStore(adminUrl)
  cleanups.push(() => store.cleanup())
  const database = new URL(store.url).pathname.slice(1)
  const db: Db = connectPostgres(store.url, { max: o.concurrency })
  const systems = new Map<SystemName, System>()
  for (const name of baselineSystems.filter((n) => o.systems.includes(n))) {
    const jwt = name === 'http-jwt'
    const gw = await startLeaseGateway(tmp, store, o.concurrency, config, jwt, { cli: pathToFileURL(b.cli), name: 'baseline' })
    cleanups.unshift(() => gw.stop())
    const steps = httpSteps(poolOf(gw.port), jwt ? benchTokens() : undefined)
    systems.set(name, fencegateSystem({ name: `${httpNames[name]!} @${ref}`, database, db, steps, batch: 1, longPoll: true, gatewayPid: gw.child.pid }))
  }
  cleanups.unshift(() => db.close())
  return systems
}

const jobType = { name: jobTypeName, lease: '60s', max_attempts: 3 }
const unusedRoute = { name: 'unused', method: 'POST', path: '/unused', upstream: 'http://127.0.0.1:9', fence: 'off' }

/** Runs the leases bench; resolves to the process exit code. */
export async function runLeasesBench(argv: string[]): Promise<number> {
  let o: Options | undefined
  try {
    o = parseLeaseOptions(argv)
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
    console.log(`workload: no-op jobs, ${o.concurrency} in flight, depths ${o.depths.join(', ')}${o.steadyJobs ? `, steady ${o.steadyJobs} jobs (${o.producers} producers, backlog ${o.backlog})` : ''}, batch ${o.batch}${o.systems.some(isSdkSystem) ? `, SDK rows at ${o.slots.join(', ')} slot(s)` : ''}, ${o.rounds} round(s) after a discarded warm-up`)
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
    const baseline = o.baseline ? await startBaseline(o.baseline, o, tmp, adminUrl, gatewayConfig, cleanups, poolOf) : new Map<SystemName, System>()
    const systems: System[] = []
    const fg = (name: string, steps: ReturnType<typeof storeSteps>, batch: number, http?: LeaseGateway) =>
      fencegateSystem({ name, database: fgDatabase, db, steps, batch, longPoll: http !== undefined, ...(http ? { gatewayPid: http.child.pid } : {}) })
    for (const name of o.systems) {
      if (name === 'store') systems.push(fg('fencegate store, 1 per claim', storeSteps(jobs, types), 1))
      if (name === 'store-batch') systems.push(fg(`fencegate store, ${o.batch} per claim`, storeSteps(jobs, types), o.batch))
      if (name === 'http') systems.push(fg(httpNames.http!, httpSteps(pool), 1, gateway))
      if (name === 'http-jwt') systems.push(fg(httpNames['http-jwt']!, httpSteps(poolOf(jwtGateway!.port), benchTokens()), 1, jwtGateway))
      // Right after its current counterpart, so both run in every round at nearly the same time.
      const other = baseline.get(name)
      if (other) systems.push(other)
      if (name === 'http-batch') systems.push(fg(`fencegate HTTP, ${o.batch} per claim`, httpSteps(pool), o.batch, gateway))
      if (name === 'graphile') {
        const graphileDb = await freshDatabase(adminUrl, `graphile_bench_${Date.now()}`)
        cleanups.push(() => graphileDb.drop())
        const g = await graphileSystem({ url: graphileDb.url, database: new URL(graphileDb.url).pathname.slice(1), connections: o.concurrency })
        cleanups.unshift(() => g.close())
        systems.push(g)
      }
    }
    // After the others, grouped by slots: each Python row runs right after the TS SDK's of its slots.
    for (const slots of o.slots) {
      for (const name of o.systems.filter(isSdkSystem)) {
        const worker = name === 'sdk' ? tsSdkWorker(`http://127.0.0.1:${gateway.port}`, slots, jobTypeName) : await pythonWorker(`http://127.0.0.1:${gateway.port}`, name === 'py-sdk' ? 'sync' : 'async', slots, jobTypeName)
        cleanups.unshift(() => worker.close())
        systems.push(sdkSystem(sdkCaseName(name, slots), fg(name, httpSteps(pool), 1, gateway), worker, httpSteps(pool).start))
      }
    }
    const signal = interrupted.signal
    const tag = Date.now().toString(36)
    for (const s of systems) await phase(s, o, 0, 'warm-up', Math.min(300, o.depths[0] ?? 300), `${tag}.warm`, cpu, signal, watch)
    const phases: Phase[] = []
    for (let r = 1; r <= o.rounds; r++) {
      for (const depth of o.depths) {
        for (const s of systems) phases.push(await phase(s, o, r, `depth ${depth}`, depth, `${tag}.r${r}.d${depth}`, cpu, signal, watch))
      }
      if (o.steadyJobs) for (const s of systems) phases.push(await phase(s, o, r, 'steady', undefined, `${tag}.r${r}.s`, cpu, signal, watch))
      console.log(`round ${r} done; load average ${loadavg().map((l) => l.toFixed(2)).join(' ')}`)
    }
    console.log(['', ...report(phases, o.rounds)].join('\n'))
    if (o.baseline) {
      const pairs = [...baseline.keys()].map((n): [string, string] => [httpNames[n]!, `${httpNames[n]!} @${o.baseline}`])
      console.log(`\nthis build against ${o.baseline} (ratio within each round, median over rounds; jobs/s above 1 and CPU below 1 favour this build):`)
      for (const r of baselineRatios(phases, pairs)) console.log(`  ${r.regime}, ${r.current}: jobs/s ${r.jobsPerSecond.toFixed(3)}x, gateway CPU µs/job ${r.gatewayCpu.toFixed(3)}x`)
    }
    const sdk = sdkPairs(o.systems, o.slots)
    if (sdk.length) console.log(['\nthe Python SDK against the TS SDK at the same slots (jobs/s, ratio within each round, median over rounds):', ...sdkRatioLines(phases, sdk)].join('\n'))
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
