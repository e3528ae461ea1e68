// `npm run bench`: passthrough vs fenced vs idempotent forwarding through one gateway, in
// one run, and the gateway's memory. Three processes share the machine: this one
// (autocannon), the gateway and the upstream, so the load generator cannot starve the
// gateway's event loop of its own core. The whole scenario set runs `--passes` times
// (default 2) on the same gateway, so memory growth between equal passes shows.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { availableParallelism, cpus, loadavg, tmpdir } from 'node:os'
import { join } from 'node:path'
import { Pool } from 'undici'
import { runLoad, Tally, type Outgoing } from './load.js'
import { openWindow, readProbe } from './memory.js'
import { parseOptions, recommendedGatewayNodeOptions, usage, UsageError, type BenchOptions, type ScenarioName } from './options.js'
import { cpuBetween, cpuSeconds, freePort, isHealthy, machineCpu, memoryKiB, postgresCpu, startChild, stopChild, upstreamPort, waitUntil, type Child } from './procs.js'
import { report, type Measured, type PassEnd } from './report.js'
import { prepareStore, type BenchStore } from './store.js'

// `npm run bench -- leases` is the lease service's own bench (bench/leases.ts); the rest of this file never runs then.
if (process.argv[2] === 'leases') process.exit(await (await import('./leases.js')).runLeasesBench(process.argv.slice(3)))

export interface Scenario {
  name: ScenarioName
  what: string
  /** Fraction of passthrough req/s this scenario should reach. */
  target?: number
  /** What every response must say about replays: `none` (each key is new) or `all` (each key completed before). */
  replays?: 'none' | 'all'
  /** Runs before the warm-up (e.g. completes the keys to replay); returns a line for the report. */
  prepare?: (fence: string, signal: AbortSignal) => Promise<string>
  /** Called once per request. */
  request: () => Outgoing
}

const body = Buffer.from('{"amount":1250,"currency":"EUR"}')
const baseHeaders = (fence: string) => ({ 'content-type': 'application/json', 'x-execution-fence': fence })

// The raise scenario's fences: above every fence of an earlier run (they count up from the
// clock), on entities (invoice:r<id>) the other scenarios never use, across passes.
let raised = BigInt(Date.now()) * 1_000_000n

/**
 * The scenario set of one pass. Keys are `<keyPrefix><pass>.<n>`: new in every pass and
 * every run, so the passes do equal work and a reused database never replays an old key.
 */
function scenarios(options: BenchOptions, gatewayUrl: string, keyPrefix: string, pass: number): Scenario[] {
  const { ids } = options
  const id = () => Math.floor(Math.random() * ids)
  let n = 0
  const newKey = () => ({ 'idempotency-key': `${keyPrefix}${pass}.${n++}` })
  // The replay pool: key i always goes with invoice i, so every replay has its original's payload.
  const pooled = (i: number): Outgoing => ({
    path: `/idempotent/payments/${i % ids}/capture`,
    headers: { 'idempotency-key': `${keyPrefix}${pass}.r${i}` },
  })
  const all: Scenario[] = [
    { name: 'passthrough', what: 'fence: off, no store call', request: () => ({ path: `/passthrough/${id()}/capture` }) },
    { name: 'spread', what: `fenced, ${ids} invoice ids`, target: 0.5, request: () => ({ path: `/payments/${id()}/capture` }) },
    {
      // Every request raises its entity's fence, so each writes a fence history row (spread has equal fences: none).
      name: 'raise', what: `fenced, a raise on every request, ${ids} ids`, target: 0.5,
      request: () => ({ path: `/payments/r${id()}/capture`, headers: { 'x-execution-fence': (raised++).toString() } }),
    },
    { name: 'hot', what: 'fenced, one invoice', target: 0.25, request: () => ({ path: '/payments/hot/capture' }) },
    {
      name: 'idem-spread', what: `fenced + new key each, ${ids} ids`, target: 0.5, replays: 'none',
      request: () => ({ path: `/idempotent/payments/${id()}/capture`, headers: newKey() }),
    },
    {
      name: 'replay', what: `fenced + ${options.replayKeys} completed keys`, target: 0.7, replays: 'all',
      prepare: (fence, signal) => completeKeys(gatewayUrl, options.replayKeys, options.connections, pooled, fence, signal),
      request: () => pooled(Math.floor(Math.random() * options.replayKeys)),
    },
    {
      name: 'idem-hot', what: 'fenced + new key each, one invoice', target: 0.25, replays: 'none',
      request: () => ({ path: '/idempotent/payments/hot/capture', headers: newKey() }),
    },
  ]
  return all.filter((s) => options.scenarios.includes(s.name))
}

/** Sends each pooled key once, so that each is completed; what came back is the report line. */
async function completeKeys(url: string, count: number, connections: number, request: (i: number) => Outgoing, fence: string, signal: AbortSignal): Promise<string> {
  const pool = new Pool(url, { connections, headersTimeout: 10_000, bodyTimeout: 10_000 })
  const statuses: Record<string, number> = {}
  let replayed = 0
  let next = 0
  const started = performance.now()
  const worker = async () => {
    while (next < count && !signal.aborted) {
      const o = request(next++)
      try {
        const res = await pool.request({ path: o.path, method: 'POST', headers: { ...baseHeaders(fence), ...o.headers }, body })
        await res.body.arrayBuffer()
        statuses[res.statusCode] = (statuses[res.statusCode] ?? 0) + 1
        if (res.headers['idempotent-replayed'] === 'true') replayed++
      } catch {
        statuses.error = (statuses.error ?? 0) + 1
      }
    }
  }
  try {
    await Promise.all(Array.from({ length: Math.min(connections, count) }, worker))
  } finally {
    await pool.close()
  }
  const s = (performance.now() - started) / 1000
  return `${count} keys completed first in ${s.toFixed(1)} s (statuses ${JSON.stringify(statuses)}, ${replayed} replayed)`
}

function gatewayConfig(upstream: string, port: number, adminPort: number, dataDir: string | undefined): string {
  const route = { method: 'POST', upstream, timeout_ms: 10_000 }
  const entity = 'invoice:{params.invoice_id}'
  // YAML is a superset of JSON; `warn` keeps the per-request info lines out of the measurement.
  return JSON.stringify({
    server: { host: '127.0.0.1', port, admin_host: '127.0.0.1', admin_port: adminPort },
    ...(dataDir ? { store: { data_dir: dataDir } } : {}),
    log: { level: 'warn' },
    routes: [
      { ...route, name: 'passthrough', path: '/passthrough/:invoice_id/capture', fence: 'off' },
      { ...route, name: 'capture', path: '/payments/:invoice_id/capture', entity, fence: 'required' },
      { ...route, name: 'capture-once', path: '/idempotent/payments/:invoice_id/capture', entity, fence: 'required', idempotency: 'required' },
    ],
  }, null, 2)
}

interface Gateway {
  url: string
  gateway: Child
  upstream: Child
  probeFile: string
}

/**
 * Prepares, then warms up in batches of about a second until the warm-up time has passed
 * (at least one), then measures in runs sized from the latest rate until `duration` seconds
 * of load are summed: usually one run, sometimes a short top-up. The memory window spans
 * all three, since the warm-up is load too.
 */
async function measure(scenario: Scenario, gw: Gateway, options: BenchOptions, fence: () => string, signal: AbortSignal): Promise<Measured> {
  const memory = openWindow(gw.gateway.pid, gw.probeFile)
  const prepared = scenario.prepare ? await scenario.prepare(fence(), signal) : undefined
  const load = (amount: number, tally: Tally, maxSeconds: number) => runLoad({
    url: gw.url,
    connections: options.connections,
    amount,
    maxSeconds,
    request: scenario.request,
    headers: baseHeaders(fence()),
    body,
    signal,
  }, tally)
  const minBatch = options.connections * 20
  const warmUntil = performance.now() + options.warmup * 1000
  const warmup = new Tally()
  let rate = 0
  for (let i = 0; i < 1000 && !signal.aborted && (i === 0 || performance.now() < warmUntil); i++) {
    rate = await load(Math.max(minBatch, Math.round(rate)), warmup, 60)
  }

  const tally = new Tally()
  const cpuNow = () => ({ at: performance.now(), gw: cpuSeconds(gw.gateway.pid), up: cpuSeconds(gw.upstream.pid), self: process.cpuUsage(), pg: postgresCpu(), machine: machineCpu() })
  const before = cpuNow()
  const giveUpAt = before.at + (options.duration * 3 + 30) * 1000
  for (let i = 0; i < 20 && !signal.aborted && tally.seconds < options.duration * 0.95 && performance.now() < giveUpAt; i++) {
    const amount = Math.max(minBatch, Math.round(rate * (options.duration - tally.seconds)))
    rate = await load(amount, tally, (giveUpAt - performance.now()) / 1000)
  }
  const after = cpuNow()
  const s = Math.max(1e-9, (after.at - before.at) / 1000)
  const cores = { gateway: (after.gw - before.gw) / s, upstream: (after.up - before.up) / s, load: (after.self.user + after.self.system - before.self.user - before.self.system) / 1e6 / s, postgres: cpuBetween(before.pg, after.pg) / s }
  const machineBusy = after.machine.busy - before.machine.busy
  return {
    scenario,
    tally,
    warmup,
    prepared,
    memory: memory(),
    cpu: {
      ...cores,
      // Whatever else ran: other sessions' processes, the kernel's own threads, short-lived postgres backends.
      other: Math.max(0, machineBusy / s - cores.gateway - cores.upstream - cores.load - cores.postgres),
      machine: machineBusy / Math.max(1e-9, after.machine.total - before.machine.total),
    },
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

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

  const controller = new AbortController()
  const interrupt = () => controller.abort()
  process.once('SIGINT', interrupt)
  const children: Child[] = []
  // A last resort so the bench always ends: every run at its own limits (each scenario but
  // passthrough is followed by a passthrough run), plus setup and shutdown.
  const perScenarioMs = (options.warmup + 60 + options.duration * 3 + 30 + 60) * 1000
  const runsPerPass = options.scenarios.length * 2 - 1
  const budgetMs = options.passes * runsPerPass * perScenarioMs + 120_000
  const watchdog = setTimeout(() => {
    console.error(`bench: still running after ${budgetMs} ms; giving up`)
    for (const c of children) c.process.kill('SIGKILL')
    process.exit(1)
  }, budgetMs)
  watchdog.unref()

  const tmp = mkdtempSync(join(tmpdir(), 'fencegate-bench-config-'))
  let store: BenchStore | undefined
  try {
    store = await prepareStore(options)
    console.log(`machine: ${availableParallelism()} cores (${cpus()[0]?.model ?? 'unknown'}), node ${process.version}, load average ${loadavg().map((l) => l.toFixed(2)).join(' ')} (1/5/15 min)`)
    console.log(`store: ${store.description} at ${store.location}`)
    console.log(`load: ${options.connections} connections, ${options.warmup}s warm-up + ${options.duration}s measured per scenario, ${options.passes} pass(es); passthrough runs again after every other scenario, whose ratio is against the passthrough runs on either side of it`)
    const recommended = options.gatewayNodeOptions.join(' ') === recommendedGatewayNodeOptions.join(' ')
    console.log(`gateway node options: ${options.gatewayNodeOptions.join(' ') || '(none)'}${recommended ? ' (the deployment recommendation in docs/benchmarks.md; --gateway-node-options= runs without)' : ''}`)

    const upstream = startChild('upstream', new URL('./upstream.js', import.meta.url), [], process.env)
    children.push(upstream)
    const upstreamUrl = `http://127.0.0.1:${await upstreamPort(upstream)}`
    const [port, adminPort] = [await freePort(), await freePort()]
    const configFile = join(tmp, 'fencegate.bench.yaml')
    const probeFile = join(tmp, 'gateway-memory.jsonl')
    writeFileSync(configFile, gatewayConfig(upstreamUrl, port, adminPort, store.dataDir))
    // The probe only samples memory counters inside the gateway (see bench/probe.ts).
    const probe = ['--import', new URL('./probe.js', import.meta.url).href]
    const gateway = startChild('gateway', new URL('../src/cli/main.js', import.meta.url),
      ['serve', '--config', configFile, '--port', String(port), '--admin-port', String(adminPort)],
      { ...store.gatewayEnv(process.env), FENCEGATE_BENCH_PROBE: probeFile }, [...options.gatewayNodeOptions, ...probe], options.gatewayLog)
    children.push(gateway)
    await waitUntil(gateway, 'healthy', () => isHealthy(`http://127.0.0.1:${adminPort}/health`), 60_000)
    const startupPeakKiB = memoryKiB(gateway.pid, 'VmHWM')

    // A dead child would otherwise leave autocannon retrying until its time limit.
    for (const c of [gateway, upstream]) void c.exited.then(() => controller.abort())

    // Equal fences are accepted (>= the highest), so one fence per autocannon run never goes
    // stale, even when concurrent requests on the hot entity reach the store out of order;
    // each request still upserts the row under its lock and commits. Runs never overlap and
    // count up from the clock, so a reused database's earlier fences are always lower.
    const fenceBase = BigInt(Date.now()) * 1000n
    let run = 0n
    const nextFence = () => (fenceBase + run++).toString()
    const keyPrefix = `b${Date.now().toString(36)}.`
    const startedAt = new Date(Date.now() - 1000)
    const gw: Gateway = { url: `http://127.0.0.1:${port}`, gateway, upstream, probeFile }
    // Priming, discarded: one batch of every scenario opens every pool (clients, upstream, store)
    // and compiles every code path, so that pass 1 and pass 2 start from the same state and a
    // difference between them is growth, not start-up.
    console.log('priming: one batch of every scenario, discarded...')
    const primeWindow = openWindow(gateway.pid, probeFile)
    for (const scenario of scenarios(options, gw.url, keyPrefix, 0)) {
      if (controller.signal.aborted) break
      if (scenario.prepare) await scenario.prepare(nextFence(), controller.signal)
      await runLoad({ url: gw.url, connections: options.connections, amount: options.connections * 20, maxSeconds: 60, request: scenario.request, headers: baseHeaders(nextFence()), body, signal: controller.signal }, new Tally())
    }
    const primedPeakKiB = primeWindow().peakKiB
    const passes: Measured[][] = []
    const ends: PassEnd[] = []
    for (let pass = 1; pass <= options.passes && !controller.signal.aborted; pass++) {
      const measured: Measured[] = []
      const set = scenarios(options, gw.url, keyPrefix, pass)
      const passthrough = set.find((s) => s.name === 'passthrough')!
      const run = async (scenario: Scenario, what: string) => {
        console.log(`pass ${pass}: running ${scenario.name} (${what})...`)
        const m = await measure(scenario, gw, options, nextFence, controller.signal)
        for (const c of [gateway, upstream]) {
          if (c.process.exitCode !== null || c.process.signalCode !== null) throw new Error(`${c.name} died during ${scenario.name} (${c.process.exitCode ?? c.process.signalCode}):\n${c.output()}`)
        }
        return m
      }
      // The baseline runs again after every scenario, and a scenario is compared with the
      // passthrough runs on either side of it: this machine's speed drifts by a third within
      // minutes (passthrough at 2,452 and 1,679 req/s in two passes of one run), and a
      // baseline taken minutes before a scenario moved its ratio with it.
      let before: Measured | undefined
      for (const scenario of set) {
        if (controller.signal.aborted) break
        const m = await run(scenario, scenario.what)
        if (scenario === passthrough) {
          before = m
        } else {
          if (controller.signal.aborted) break
          const after = await run(passthrough, `the baseline after ${scenario.name}`)
          m.baseline = [before!, after]
          before = after
        }
        measured.push(m)
      }
      passes.push(measured)
      // What the gateway keeps once a pass is over and it has been idle for a second.
      await sleep(1000)
      const last = readProbe(probeFile, Date.now() - 1000).at(-1)
      ends.push({ rssKiB: memoryKiB(gateway.pid, 'VmRSS'), sample: last })
    }
    await stopChild(gateway)
    await stopChild(upstream)
    if (passes.length < options.passes || passes.some((p) => p.length < options.scenarios.length)) {
      console.error('bench: interrupted')
      return 130
    }
    report({ passes, ends, startupPeakKiB, primedPeakKiB, store, options })
    // A rough sign of other work on the machine; the `other` CPU column above is the direct one.
    console.log(`load average at the end: ${loadavg().map((l) => l.toFixed(2)).join(' ')} (1/5/15 min)`)
    const seen = await store.check(fenceBase, startedAt, keyPrefix)
    console.log(`store after the run: ${seen.entities} entities hold a fence from this run, ${seen.rejections} audit rows (rejections) since it began, this run's idempotency records by state ${JSON.stringify(seen.keys)}`)
    return 0
  } finally {
    for (const c of children) await stopChild(c)
    await store?.cleanup().catch((err: unknown) => console.error(`bench: cleanup failed: ${(err as Error).message}`))
    rmSync(tmp, { recursive: true, force: true })
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
