// `npm run bench`: fencegate side by side with what a user would otherwise run, in one run:
// nginx `proxy_pass`, a bare Node proxy, a hand-rolled fence (and fence + key), and the
// gateway's own cases, in interleaved rounds so that every ratio compares runs minutes apart
// at most. Every system is its own process, so each one's CPU per request is read from /proc.
// See docs/benchmarks.md for the method.
import { mkdtempSync, rmSync } from 'node:fs'
import { availableParallelism, cpus, loadavg, tmpdir } from 'node:os'
import { join } from 'node:path'
import { cases, trafficFactory, withEmbedded, withTraces, withWorkers, type Case } from './cases.js'
import { wrkAvailable, type LoadGenerator } from './load.js'
import { measure, warmUp, type RunSpec, type Sample } from './measure.js'
import { parseOptions, usage, UsageError, type BenchOptions, type CaseName } from './run-options.js'
import { memoryKiB } from './procs.js'
import { completeKeys, probeCase, seedEntities } from './prepare.js'
import { context, printTargets, resultJson, rows, table, targets, tracingCost, type Results } from './report.js'
import { prepareStore, type BenchStore } from './fresh-db.js'
import { sinkStats, startSystems, workersPool, type SystemName, type Systems } from './systems.js'
import type { Traffic } from './traffic.js'

// `npm run bench -- leases` is the lease service's own bench (bench/leases.ts), and
// `npm run bench -- profile` profiles the gateway (bench/profile.ts); the rest of this file never runs then.
if (process.argv[2] === 'leases') process.exit(await (await import('./leases.js')).runLeasesBench(process.argv.slice(3)))
// `npm run bench -- faults`: the store-fault run (bench/faults.ts).
if (process.argv[2] === 'faults') process.exit(await (await import('./faults.js')).runFaultsBench())
// `npm run bench -- positions`: the cost of tracking acknowledged WAL positions (bench/positions.ts).
if (process.argv[2] === 'positions') process.exit(await (await import('./positions.js')).runPositionsBench())
if (process.argv[2] === 'profile') process.exit(await (await import('./profile.js')).runProfile(process.argv.slice(3)))

function line(c: Case, s: Sample): string {
  const us = (cpu: number) => (s.load.requests > 0 ? Math.round((cpu / s.load.requests) * 1e6) : NaN)
  return `round ${s.round} ${c.name.padEnd(11)} ${Math.round(s.load.rps).toString().padStart(6)} req/s  p50 ${s.load.p50ms.toFixed(2)} ms  p99 ${s.load.p99ms.toFixed(2)} ms  ` +
    `proxy ${us(s.cpu.proxy)} µs/req  postgres ${us(s.cpu.postgres)} µs/req  non-2xx ${s.load.non2xx}  errors ${s.load.errors}`
}

async function rounds(options: BenchOptions, selected: Case[], systems: Systems, store: BenchStore, spec: RunSpec, traffic: (c: Case) => Traffic): Promise<Results> {
  const results: Results = new Map()
  for (let round = 1; round <= options.rounds && !spec.signal.aborted; round++) {
    // Each round starts one case later, so no case always follows the same one.
    const shift = (round - 1) % selected.length
    const order = [...selected.slice(shift), ...selected.slice(0, shift)]
    for (const c of order) {
      if (spec.signal.aborted) break
      if (options.warmup > 0) await warmUp(c, systems, traffic(c), { ...spec, seconds: options.warmup })
      const s = await measure(c, round, systems, store, traffic(c), spec)
      for (const child of [systems.upstream, ...(systems.sink ? [systems.sink.child] : []), ...Object.values(systems.running).map((r) => r.child)]) {
        if (child.process.exitCode !== null || child.process.signalCode !== null) throw new Error(`${child.name} died during ${c.name}:\n${child.output()}`)
      }
      console.log(line(c, s))
      results.set(c.name, [...(results.get(c.name) ?? []), s])
    }
  }
  return results
}

function printHeader(options: BenchOptions, kind: LoadGenerator, store: BenchStore, systems: Systems): void {
  console.log(`machine: ${availableParallelism()} cores (${cpus()[0]?.model ?? 'unknown'}), node ${process.version}, load average ${loadavg().map((l) => l.toFixed(2)).join(' ')} (1/5/15 min)${options.note ? `; ${options.note}` : ''}`)
  console.log(`store: ${store.description}, ${store.location}`)
  console.log(`upstream: ${systems.upstreamWhat}${systems.nginxNote ? `; ${systems.nginxNote}` : ''}`)
  console.log(`load: ${kind === 'wrk' ? 'wrk, 1 thread' : 'autocannon'}, ${options.connections} connections, 32-byte JSON POST, ${options.rounds} interleaved round(s) of ${options.warmup} s warm-up + ${options.duration} s measured per case`)
  console.log(`gateway: fencegate serve, node flags: ${options.gatewayNodeOptions.join(' ') || 'none (the defaults of `npx fencegate serve`)'}`)
  if (systems.running['gateway-workers']) {
    console.log(`gateway with workers: fencegate serve with server.workers ${options.workers} and store.max_connections ${workersPool(options)} (${options.pool} statement connections and a LISTEN connection per worker)`)
  }
  if (systems.running['gateway-pglite']) console.log('gateway on the embedded store: fencegate serve with store.data_dir in the bench\'s temporary directory and no DATABASE_URL (PGlite in the gateway\'s process: its CPU is the gateway\'s)')
  if (systems.running['gateway-traces']) {
    console.log(`gateway with traces: OTEL_TRACES_SAMPLER=parentbased_traceidratio OTEL_TRACES_SAMPLER_ARG=${options.traces}, OTLP/HTTP protobuf to a sink in its own process (bench/otlp-sink.ts)`)
  }
}

/** Requests a case must have served in the priming pass. */
const primeRequests = 5000

/** Completes the replay pool, checks each case with one request, then primes every case. */
async function prepareCases(options: BenchOptions, selected: Case[], systems: Systems, spec: RunSpec, traffic: (c: Case) => Traffic): Promise<void> {
  // Once per store: the gateways on PostgreSQL share its keys, the embedded one has its own.
  const pooled = new Set<string>()
  for (const replay of selected.filter((c) => c.traffic.key === 'replay')) {
    const gateway = systems.running[replay.system]
    const store = replay.system === 'gateway-pglite' ? 'pglite' : 'postgres'
    if (!gateway || pooled.has(store)) continue
    pooled.add(store)
    console.log(`replay pool (${store}): ${await completeKeys(gateway.url, traffic(replay), options.connections, spec.signal)}`)
  }
  // Once per system and path: fg-spread and fg-key share the gateway's invoice entities,
  // hand-fence and hand-key the hand-rolled table.
  const seeded = new Set<string>()
  for (const c of selected) {
    const system = systems.running[c.system]
    if (!system || c.seedPath === undefined || seeded.has(`${c.system} ${c.seedPath}`)) continue
    seeded.add(`${c.system} ${c.seedPath}`)
    console.log(`seeding: ${await seedEntities(system.url, { ...traffic(c), path: c.seedPath, key: 'none' }, options.connections, spec.signal)}`)
  }
  for (const c of selected) {
    const problem = await probeCase(c, systems.running[c.system]!.url, traffic(c))
    if (problem) console.log(`warning: ${c.name}: ${problem}`)
  }
  // Priming, discarded: every case before round 1, so every code path of every system is
  // compiled and every pool open. A fresh gateway's first runs of fg-off cost it several times
  // the CPU per request of later ones (114, 259, 758 req/s in three 3 s runs). V8 optimises
  // after enough calls, not seconds, so on a busy machine a case is primed again (up to three
  // times) until it has served `primeRequests`.
  if (options.prime === 0) return
  console.log(`priming: every case for ${options.prime} s (again, up to 3 times, until ${primeRequests} requests), discarded...`)
  for (const c of selected) {
    let served = 0
    for (let i = 0; i < 3 && served < primeRequests && !spec.signal.aborted; i++) {
      served += (await warmUp(c, systems, traffic(c), { ...spec, seconds: options.prime })).requests
    }
  }
}

async function printResults(options: BenchOptions, kind: LoadGenerator, store: BenchStore, systems: Systems, results: Results, ran: readonly Case[]): Promise<void> {
  const gateway = systems.running.gateway
  const peakKiB = gateway ? memoryKiB(gateway.child.pid, 'VmHWM') : undefined
  console.log('')
  console.log(`=== medians of ${options.rounds} round(s)${options.note ? ` (${options.note})` : ''}; ratios are taken within each round ===`)
  for (const l of table(rows(results, ran))) console.log(l)
  console.log('')
  for (const l of context(results, ran)) console.log(l)
  console.log('')
  if (systems.sink) {
    for (const l of tracingCost(results, ran)) console.log(l)
    const got = await sinkStats(systems.sink.url).catch(() => undefined)
    console.log(`OTLP sink received: ${got ? `${got.requests} export requests, ${(got.bytes / 1024).toFixed(0)} KiB` : 'unknown (it did not answer)'}`)
    console.log('')
  }
  console.log(`gateway peak RSS (VmHWM since start): ${peakKiB === undefined ? 'unknown' : `${(peakKiB / 1024).toFixed(1)} MiB`}`)
  console.log('targets (issue 13; quiet machine, median of 3 rounds):')
  const checks = targets(results, ran, peakKiB, options.gatewayNodeOptions.length === 0)
  for (const l of printTargets(checks)) console.log(`  ${l}`)
  console.log(resultJson(results, {
    note: options.note ?? null, store: store.description, upstream: systems.upstreamWhat, load: kind, connections: options.connections,
    workers: options.workers, traces: options.traces ?? null, rounds: options.rounds, duration_s: options.duration, warmup_s: options.warmup, prime_s: options.prime, gateway_peak_rss_kib: peakKiB ?? null,
    targets: checks,
  }))
  console.log(`load average at the end: ${loadavg().map((l) => l.toFixed(2)).join(' ')} (1/5/15 min)`)
}

async function main(argv: string[]): Promise<number> {
  let options: BenchOptions | undefined
  try {
    options = parseOptions(argv, process.env)
  } catch (err) {
    if (!(err instanceof UsageError)) throw err
    console.error(`bench: ${err.message}\n\n${usage()}`)
    return 2
  }
  if (!options) {
    console.log(usage())
    return 0
  }
  const kind = options.load ?? (wrkAvailable() ? 'wrk' : 'autocannon')
  if (kind === 'wrk' && !wrkAvailable()) {
    console.error('bench: --load wrk, but wrk is not on PATH (Debian: apt-get install wrk)')
    return 2
  }

  const controller = new AbortController()
  const interrupt = () => controller.abort()
  process.once('SIGINT', interrupt)
  // A last resort so the bench always ends: every run at its own length plus generous setup.
  // Each of --workers, --traces and --store pglite runs every fencegate case once more.
  const runs = options.cases.length * (options.workers > 1 ? 2 : 1) * (options.traces !== undefined ? 2 : 1) * (options.embedded ? 2 : 1)
  const budgetMs = (runs * (3 * options.prime + options.rounds * (options.warmup + options.duration) + 30 * (options.rounds + 1)) + 300) * 1000
  let systems: Systems | undefined
  const watchdog = setTimeout(() => {
    console.error(`bench: still running after ${budgetMs} ms; giving up`)
    systems?.kill()
    process.exit(1)
  }, budgetMs)
  watchdog.unref()

  const dir = mkdtempSync(join(tmpdir(), 'fencegate-bench-'))
  let store: BenchStore | undefined
  try {
    store = await prepareStore(options.databaseUrl)
    const wanted = withEmbedded(withTraces(withWorkers(cases.filter((c) => options.cases.includes(c.name as CaseName)), options.workers), options.traces), options.embedded)
    systems = await startSystems(options, store, dir, new Set<SystemName>(wanted.flatMap((c) => [c.system, ...(c.upstream ? [c.upstream] : [])])))
    const selected = wanted.filter((c) => systems!.running[c.system])
    const traffic = trafficFactory(options)
    const spec: RunSpec = { kind, connections: options.connections, seconds: options.duration, dir, signal: controller.signal }

    printHeader(options, kind, store, systems)
    await prepareCases(options, selected, systems, spec, traffic)
    const results = await rounds(options, selected, systems, store, spec, traffic)
    if (controller.signal.aborted) {
      console.error('bench: interrupted')
      return 130
    }
    await printResults(options, kind, store, systems, results, selected)
    return 0
  } finally {
    await systems?.stop()
    await store?.cleanup().catch((err: unknown) => console.error(`bench: cleanup failed: ${(err as Error).message}`))
    rmSync(dir, { recursive: true, force: true })
    clearTimeout(watchdog)
    process.off('SIGINT', interrupt)
  }
}

main(process.argv.slice(2)).then((code) => {
  process.exitCode = code
}, (err: unknown) => {
  console.error(`bench: ${(err as Error)?.message ?? err}`)
  process.exitCode = 1
})
