// `npm run bench`: passthrough vs fenced forwarding through one gateway, in one run.
// Three processes share the machine: this one (autocannon), the gateway and the upstream,
// so the load generator cannot starve the gateway's event loop of its own core.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { availableParallelism, cpus, tmpdir } from 'node:os'
import { join } from 'node:path'
import { runLoad, Tally } from './load.js'
import { parseOptions, usage, UsageError, type BenchOptions } from './options.js'
import { cpuSeconds, freePort, isHealthy, machineCpu, memoryKiB, startChild, stopChild, upstreamPort, waitUntil, type Child } from './procs.js'
import { prepareStore, type BenchStore } from './store.js'

interface Scenario {
  name: 'passthrough' | 'spread' | 'hot'
  what: string
  /** Fraction of passthrough req/s this scenario should reach. */
  target?: number
  path: () => string
}

interface Measured {
  scenario: Scenario
  tally: Tally
  /** The gateway's resident set once the scenario ended. */
  rssKiB: number | undefined
  /** Cores used on average over the measured window. */
  cpu: { gateway: number; upstream: number; load: number; machine: number }
}

const scenarios = (ids: number): Scenario[] => {
  const id = () => Math.floor(Math.random() * ids)
  return [
    { name: 'passthrough', what: 'fence: off, no store call', path: () => `/passthrough/${id()}/capture` },
    { name: 'spread', what: `fence: required, ${ids} invoice ids`, target: 0.5, path: () => `/payments/${id()}/capture` },
    { name: 'hot', what: 'fence: required, one invoice', target: 0.25, path: () => '/payments/hot/capture' },
  ]
}

function gatewayConfig(upstream: string, port: number, adminPort: number, dataDir: string | undefined): string {
  const route = { method: 'POST', upstream, timeout_ms: 10_000 }
  // YAML is a superset of JSON; `warn` keeps the per-request info lines out of the measurement.
  return JSON.stringify({
    server: { host: '127.0.0.1', port, admin_host: '127.0.0.1', admin_port: adminPort },
    ...(dataDir ? { store: { data_dir: dataDir } } : {}),
    log: { level: 'warn' },
    routes: [
      { ...route, name: 'passthrough', path: '/passthrough/:invoice_id/capture', fence: 'off' },
      { ...route, name: 'capture', path: '/payments/:invoice_id/capture', entity: 'invoice:{params.invoice_id}', fence: 'required' },
    ],
  }, null, 2)
}

/**
 * Warms up in batches of about a second until the warm-up time has passed (at least
 * one), then measures in runs sized from the latest rate until `duration` seconds of
 * load are summed: usually one run, sometimes a short top-up.
 */
async function measure(scenario: Scenario, gatewayUrl: string, options: BenchOptions, fence: () => string, children: { gateway: Child; upstream: Child }, signal: AbortSignal): Promise<Measured> {
  const body = Buffer.from('{"amount":1250,"currency":"EUR"}')
  const load = (amount: number, tally: Tally, maxSeconds: number) => runLoad({
    url: gatewayUrl,
    connections: options.connections,
    amount,
    maxSeconds,
    path: scenario.path,
    headers: { 'content-type': 'application/json', 'x-execution-fence': fence() },
    body,
    signal,
  }, tally)
  const minBatch = options.connections * 20
  const warmUntil = performance.now() + options.warmup * 1000
  let rate = 0
  for (let i = 0; i < 1000 && !signal.aborted && (i === 0 || performance.now() < warmUntil); i++) {
    rate = await load(Math.max(minBatch, Math.round(rate)), new Tally(), 60)
  }

  const tally = new Tally()
  const cpuNow = () => ({ at: performance.now(), gw: cpuSeconds(children.gateway.pid), up: cpuSeconds(children.upstream.pid), self: process.cpuUsage(), machine: machineCpu() })
  const before = cpuNow()
  const giveUpAt = before.at + (options.duration * 3 + 30) * 1000
  for (let i = 0; i < 20 && !signal.aborted && tally.seconds < options.duration * 0.95 && performance.now() < giveUpAt; i++) {
    const amount = Math.max(minBatch, Math.round(rate * (options.duration - tally.seconds)))
    rate = await load(amount, tally, (giveUpAt - performance.now()) / 1000)
  }
  const after = cpuNow()
  const s = Math.max(1e-9, (after.at - before.at) / 1000)
  return {
    scenario,
    tally,
    rssKiB: memoryKiB(children.gateway.pid, 'VmRSS'),
    cpu: {
      gateway: (after.gw - before.gw) / s,
      upstream: (after.up - before.up) / s,
      load: (after.self.user + after.self.system - before.self.user - before.self.system) / 1e6 / s,
      machine: (after.machine.busy - before.machine.busy) / Math.max(1e-9, after.machine.total - before.machine.total),
    },
  }
}

const fmt = (n: number, digits = 0) => (Number.isFinite(n) ? n.toFixed(digits) : '-')

function report(results: Measured[], rssKiB: number | undefined, store: BenchStore, options: BenchOptions): void {
  const base = results.find((r) => r.scenario.name === 'passthrough')!.tally.rps
  const p = (r: Measured, q: number) => r.tally.latencies.percentile(q)
  console.log('')
  console.log('scenario      what                                 requests      s    req/s   p50 ms   p99 ms  non-2xx  vs passthrough')
  for (const r of results) {
    const t = r.tally
    const ratio = t.rps / base
    const target = r.scenario.target === undefined ? '' : `  (target >= ${fmt(r.scenario.target * 100)}%: ${ratio >= r.scenario.target ? 'met' : 'MISSED'})`
    console.log(`${r.scenario.name.padEnd(13)} ${r.scenario.what.padEnd(36)} ${String(t.requests).padStart(8)} ${fmt(t.seconds, 1).padStart(6)} ${fmt(t.rps).padStart(8)} ${fmt(p(r, 50), 2).padStart(8)} ${fmt(p(r, 99), 2).padStart(8)} ${String(t.non2xx).padStart(8)}  ${fmt(ratio * 100, 1).padStart(6)}%${target}`)
  }
  console.log('')
  console.log('CPU during the measured window, in cores (machine: share of all cores busy)')
  for (const r of results) {
    const { gateway, upstream, load, machine } = r.cpu
    const rss = r.rssKiB === undefined ? '' : `  gateway RSS after: ${fmt(r.rssKiB / 1024)} MiB`
    console.log(`${r.scenario.name.padEnd(13)} gateway ${fmt(gateway, 2)}  upstream ${fmt(upstream, 2)}  autocannon ${fmt(load, 2)}  machine ${fmt(machine * 100)}% busy${rss}`)
  }
  for (const { scenario, tally: t } of results) {
    if (t.non2xx > 0 || t.errors > 0) console.log(`warning: ${scenario.name}: non-2xx by status ${JSON.stringify(t.statuses)}, errors ${t.errors}, timeouts ${t.timeouts}`)
  }
  console.log('')
  console.log(`gateway peak RSS (VmHWM): ${rssKiB === undefined ? 'unavailable' : `${fmt(rssKiB / 1024, 1)} MiB`}`)
  console.log(JSON.stringify({
    event: 'bench_result',
    store: store.description,
    connections: options.connections,
    duration_s: options.duration,
    gateway_peak_rss_kib: rssKiB ?? null,
    scenarios: results.map((r) => ({
      name: r.scenario.name, requests: r.tally.requests, seconds: +r.tally.seconds.toFixed(2), rps: Math.round(r.tally.rps),
      p50_ms: +p(r, 50).toFixed(3), p99_ms: +p(r, 99).toFixed(3), non2xx: r.tally.non2xx, errors: r.tally.errors,
      ratio: +(r.tally.rps / base).toFixed(3),
    })),
  }))
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

  const controller = new AbortController()
  const interrupt = () => controller.abort()
  process.once('SIGINT', interrupt)
  const children: Child[] = []
  // A last resort so the bench always ends: every scenario at its own limits, plus setup and shutdown.
  const budgetMs = 3 * (options.warmup + 60 + options.duration * 3 + 30) * 1000 + 120_000
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
    console.log(`machine: ${availableParallelism()} cores (${cpus()[0]?.model ?? 'unknown'}), node ${process.version}`)
    console.log(`store: ${store.description} at ${store.location}`)
    console.log(`load: ${options.connections} connections, ${options.warmup}s warm-up + ${options.duration}s measured per scenario`)

    const upstream = startChild('upstream', new URL('./upstream.js', import.meta.url), [], process.env)
    children.push(upstream)
    const upstreamUrl = `http://127.0.0.1:${await upstreamPort(upstream)}`
    const [port, adminPort] = [await freePort(), await freePort()]
    const configFile = join(tmp, 'fencegate.bench.yaml')
    writeFileSync(configFile, gatewayConfig(upstreamUrl, port, adminPort, store.dataDir))
    const gateway = startChild('gateway', new URL('../src/cli/main.js', import.meta.url),
      ['serve', '--config', configFile, '--port', String(port), '--admin-port', String(adminPort)], store.gatewayEnv(process.env))
    children.push(gateway)
    await waitUntil(gateway, 'healthy', () => isHealthy(`http://127.0.0.1:${adminPort}/health`), 60_000)

    // A dead child would otherwise leave autocannon retrying until its time limit.
    for (const c of [gateway, upstream]) void c.exited.then(() => controller.abort())

    // Equal fences are accepted (>= the highest), so one fence per autocannon run never goes
    // stale, even when concurrent requests on the hot entity reach the store out of order;
    // each request still upserts the row under its lock and commits. Runs never overlap and
    // count up from the clock, so a reused database's earlier fences are always lower.
    const fenceBase = BigInt(Date.now()) * 1000n
    let run = 0n
    const nextFence = () => (fenceBase + run++).toString()
    const startedAt = new Date(Date.now() - 1000)
    const results: Measured[] = []
    for (const scenario of scenarios(options.ids)) {
      if (controller.signal.aborted) break
      console.log(`running ${scenario.name} (${scenario.what})...`)
      const measured = await measure(scenario, `http://127.0.0.1:${port}`, options, nextFence, { gateway, upstream }, controller.signal)
      for (const c of [gateway, upstream]) {
        if (c.process.exitCode !== null || c.process.signalCode !== null) throw new Error(`${c.name} died during ${scenario.name} (${c.process.exitCode ?? c.process.signalCode}):\n${c.output()}`)
      }
      results.push(measured)
    }
    const rss = memoryKiB(gateway.pid, 'VmHWM')
    await stopChild(gateway)
    await stopChild(upstream)
    if (results.length < 3) {
      console.error('bench: interrupted')
      return 130
    }
    report(results, rss, store, options)
    const seen = await store.check(fenceBase, startedAt)
    console.log(`store after the run: ${seen.entities} entities hold a fence from this run, ${seen.rejections} audit rows (rejections) since it began`)
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
