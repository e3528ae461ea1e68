// `npm run bench -- profile`: CPU profiles of the gateway, one gateway process per case
// (default: fg-off and fg-spread), each under the same load as the bench, summarised by self
// time per module and per function. V8's sampling profiler (the one `node --cpu-prof` uses)
// runs only over the measured seconds (bench/profiler-hook.ts). The .cpuprofile files are
// kept (the path is printed) for Chrome DevTools or speedscope. With --store pglite each gateway
// runs on the embedded store, whose work (PGlite's WebAssembly) is then in the profile.
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { cases, trafficFactory } from './cases.js'
import { printSummary, summarise } from './cpuprofile.js'
import { prepareStore } from './fresh-db.js'
import { runLoad, wrkAvailable } from './load.js'
import { completeKeys } from './prepare.js'
import { stopChild } from './procs.js'
import { parseOptions, usage, UsageError, type CaseName } from './run-options.js'
import { startGateway, startSink, startSystems, tracingEnv } from './systems.js'

export async function runProfile(argv: string[]): Promise<number> {
  let options
  try {
    options = parseOptions(argv, process.env, { cases: ['fg-off', 'fg-spread'] })
  } catch (err) {
    if (!(err instanceof UsageError)) throw err
    console.error(`bench profile: ${err.message}\n\n${usage()}`)
    return 2
  }
  if (!options) {
    console.log(usage())
    return 0
  }
  const selected = cases.filter((c) => c.system === 'gateway' && options.cases.includes(c.name as CaseName))
  if (selected.length === 0) {
    console.error('bench profile: only the gateway is profiled; give fencegate cases (fg-off, fg-spread, fg-hot, fg-key, fg-replay)')
    return 2
  }
  const kind = options.load ?? (wrkAvailable() ? 'wrk' : 'autocannon')
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-profile-run-'))
  const profiles = mkdtempSync(join(tmpdir(), 'fencegate-profiles-'))
  const controller = new AbortController()
  const store = await prepareStore(options.databaseUrl)
  const systems = await startSystems(options, store, dir, new Set()).catch(async (err: unknown) => {
    await store.cleanup()
    throw err
  })
  // With --traces: every profiled gateway traces at that ratio, exporting to a sink of its own process.
  const sink = options.traces === undefined ? undefined : await startSink()
  try {
    const traffic = trafficFactory(options)
    if (sink) console.log(`tracing: sampled at ${options.traces}, OTLP/HTTP protobuf to a sink (bench/otlp-sink.ts)`)
    console.log(`upstream: ${systems.upstreamWhat}; load: ${kind}, ${options.connections} connections, ${options.prime + options.warmup} s warm-up + ${options.duration} s profiled per case`)
    for (const c of selected) {
      const name = `${c.name}.cpuprofile`
      const hook = ['--import', new URL('./profiler-hook.js', import.meta.url).href]
      const gw = await startGateway({
        dir, upstreamUrl: systems.upstreamUrl, store, pool: options.pool, nodeOptions: [...options.gatewayNodeOptions, ...hook], logFile: options.gatewayLog,
        name: `gateway-${c.name}`, ...(options.embedded ? { dataDir: join(dir, `pglite-${c.name}`) } : {}), env: { FENCEGATE_BENCH_CPUPROFILE: join(profiles, name), ...(sink && options.traces !== undefined ? tracingEnv(sink.url, options.traces) : {}) },
      })
      try {
        if (c.traffic.key === 'replay') console.log(`replay pool: ${await completeKeys(gw.url, traffic(c), options.connections, controller.signal)}`)
        const spec = { url: gw.url, connections: options.connections, dir, signal: controller.signal }
        // The priming and the warm-up of the bench, in one: a fresh gateway warms up slowly.
        const warm = options.prime + options.warmup
        if (warm > 0) await runLoad(kind, { ...spec, seconds: warm, traffic: traffic(c) })
        gw.child.process.kill('SIGUSR2')
        const r = await runLoad(kind, { ...spec, seconds: options.duration, traffic: traffic(c) })
        gw.child.process.kill('SIGUSR2')
        await waitFor(() => existsSync(join(profiles, name)), 30_000)
        console.log(`\n=== ${c.name}: ${c.label}: ${Math.round(r.rps)} req/s under the profiler (slower than without it), non-2xx ${r.non2xx} ===`)
      } finally {
        await stopChild(gw.child)
      }
      if (!readdirSync(profiles).includes(name)) {
        console.log(`no profile written for ${c.name}:\n${gw.child.output()}`)
        continue
      }
      for (const l of printSummary(summarise(join(profiles, name)))) console.log(l)
    }
    console.log(`\nprofiles kept in ${profiles}`)
    return 0
  } finally {
    if (sink) await stopChild(sink.child)
    await systems.stop()
    await store.cleanup()
    rmSync(dir, { recursive: true, force: true })
  }
}


async function waitFor(done: () => boolean, ms: number): Promise<void> {
  const until = Date.now() + ms
  while (!done() && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 100))
}
