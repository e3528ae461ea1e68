import type { Tally } from './load.js'
import type { Scenario } from './main.js'
import type { MemoryWindow, ProbeSample } from './memory.js'
import type { BenchOptions } from './options.js'
import type { BenchStore } from './store.js'

export interface Measured {
  scenario: Scenario
  /** The measured runs. */
  tally: Tally
  /** The warm-up runs, kept only to check their replay headers and statuses. */
  warmup: Tally
  /** What the scenario's preparation reported, if it had one. */
  prepared: string | undefined
  /** The gateway's memory over preparation, warm-up and measurement. */
  memory: MemoryWindow
  /** Cores used on average over the measured window. */
  cpu: { gateway: number; upstream: number; load: number; postgres: number; other: number; machine: number }
  /** The passthrough runs just before and just after this scenario, which its ratio is taken against. */
  baseline?: [Measured, Measured]
}

/** The gateway's memory once a pass ended and it idled for a second. */
export interface PassEnd {
  rssKiB: number | undefined
  sample: ProbeSample | undefined
}

/** The issue's limit, "200 MB", read strictly: 200,000,000 bytes (190.7 MiB). */
export const rssLimitBytes = 200e6
/** Pass-to-pass differences below these are noise, not growth: the live heap, and peak RSS. */
const liveTolerance = 0.1
const peakTolerance = 0.1

const fmt = (n: number | undefined, digits = 0) => (n !== undefined && Number.isFinite(n) ? n.toFixed(digits) : '-')
const mib = (bytes: number | undefined, digits = 0) => fmt(bytes === undefined ? undefined : bytes / 1048576, digits)
const kibToMib = (kib: number | undefined, digits = 1) => fmt(kib === undefined ? undefined : kib / 1024, digits)

/** Whether every response of the scenario said what it should about replays; undefined when it has no rule. */
function replayCheck(r: Measured): { ok: boolean; text: string } | undefined {
  const rule = r.scenario.replays
  if (!rule) return undefined
  const seen = r.tally.replayed + r.warmup.replayed
  const total = r.tally.requests + r.warmup.requests
  const ok = rule === 'all' ? seen === total : seen === 0
  return { ok, text: `${seen} of ${total} responses (warm-up included) carried idempotent-replayed: true; expected ${rule === 'all' ? 'all' : 'none'}` }
}

/** Gateway CPU milliseconds per response over the measured window. */
const cpuPerRequest = (r: Measured) => (r.cpu.gateway / r.tally.rps) * 1000
const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length
const passthroughOf = (pass: Measured[]) => pass.find((r) => r.scenario.name === 'passthrough')!
/** The passthrough runs a row is compared with: those on either side of it, or itself. */
const baseRuns = (pass: Measured[], r: Measured): Measured[] => r.baseline ?? [passthroughOf(pass)]
/** A row's req/s as a fraction of the mean of its baseline runs. */
const ratioOf = (pass: Measured[], r: Measured) => r.tally.rps / mean(baseRuns(pass, r).map((b) => b.tally.rps))
/** Every run of a pass, the baseline runs between the scenarios included. */
const runsOf = (pass: Measured[]) => [...pass, ...pass.flatMap((r) => r.baseline?.slice(1) ?? [])]
const peakOf = (pass: Measured[]) => Math.max(...runsOf(pass).map((r) => r.memory.peakKiB ?? 0))
/** The lowest V8 heap in use sampled during a pass, in bytes. */
const liveOf = (pass: Measured[]) => Math.min(...runsOf(pass).map((r) => r.memory.minHeapUsed ?? Infinity))

export function report(o: { passes: Measured[][]; ends: PassEnd[]; startupPeakKiB: number | undefined; primedPeakKiB: number | undefined; store: BenchStore; options: BenchOptions }): void {
  const { passes, ends, store, options } = o
  const p = (r: Measured, q: number) => r.tally.latencies.percentile(q)
  const windowed = passes.every((pass) => runsOf(pass).every((r) => r.memory.windowed))

  passes.forEach((pass, i) => {
    console.log('')
    console.log(`=== pass ${i + 1} of ${passes.length} ===`)
    console.log('scenario     what                                 requests     s   req/s  p50 ms  p99 ms non-2xx replayed  vs passthrough')
    for (const r of pass) {
      const t = r.tally
      const ratio = ratioOf(pass, r)
      const target = r.scenario.target === undefined ? '' : `  (target >= ${fmt(r.scenario.target * 100)}%: ${ratio >= r.scenario.target ? 'met' : 'MISSED'})`
      console.log(`${r.scenario.name.padEnd(12)} ${r.scenario.what.padEnd(36)} ${String(t.requests).padStart(8)} ${fmt(t.seconds, 1).padStart(5)} ${fmt(t.rps).padStart(7)} ${fmt(p(r, 50), 2).padStart(7)} ${fmt(p(r, 99), 2).padStart(7)} ${String(t.non2xx).padStart(7)} ${String(t.replayed).padStart(8)}  ${fmt(ratio * 100, 1).padStart(6)}%${target}`)
    }
    for (const r of pass) {
      if (r.baseline) {
        const [a, b] = r.baseline.map((x) => x.tally.rps) as [number, number]
        const spread = Math.abs(a - b) / Math.min(a, b)
        const run = (x: Measured, when: string) => `${fmt(x.tally.rps)} req/s ${when} (postgres ${fmt(x.cpu.postgres, 2)}, other ${fmt(x.cpu.other, 2)} cores)`
        console.log(`${r.scenario.name}: baseline: passthrough ${run(r.baseline[0], 'before')}, ${run(r.baseline[1], 'after')}${spread > 0.15 ? `; the two differ by ${fmt(spread * 100)}%: the machine's speed moved around this scenario` : ''}`)
      }
      if (r.prepared) console.log(`${r.scenario.name}: prepared: ${r.prepared}`)
      const check = replayCheck(r)
      if (check) console.log(`${r.scenario.name}: replay check ${check.ok ? 'ok' : 'FAILED'}: ${check.text}`)
      for (const [what, t] of [['measured', r.tally], ['warm-up', r.warmup]] as const) {
        if (t.non2xx > 0 || t.errors > 0) console.log(`warning: ${r.scenario.name} (${what}): non-2xx by status ${JSON.stringify(t.statuses)}, errors ${t.errors}, timeouts ${t.timeouts}`)
      }
    }
    console.log('')
    console.log('CPU during the measured window, in cores (other: everything else that ran, e.g. other work on the machine)')
    for (const r of pass) {
      const { gateway, upstream, load, postgres, other, machine } = r.cpu
      const perRequest = cpuPerRequest(r)
      const baseCpu = mean(baseRuns(pass, r).map(cpuPerRequest))
      console.log(`${r.scenario.name.padEnd(12)} gateway ${fmt(gateway, 2)} = ${fmt(perRequest, 3)} ms per request (passthrough's is ${fmt((baseCpu / perRequest) * 100).padStart(3)}% of it)  upstream ${fmt(upstream, 2)}  autocannon ${fmt(load, 2)}  postgres ${fmt(postgres, 2)}  other ${fmt(other, 2)}  machine ${fmt(machine * 100)}% busy`)
    }
    console.log('')
    console.log(`gateway memory per scenario, MiB: peak RSS (VmHWM${windowed ? ' over the scenario' : ' since start'}), then the probe sample with the highest RSS:`)
    console.log('scenario      peak RSS |    rss  V8 heap = new + old + other   used  external (ArrayBuffers)  V8 malloc | max heap used  max TCP sockets')
    for (const r of pass) {
      const m = r.memory
      const s = m.atPeak
      console.log(`${r.scenario.name.padEnd(12)} ${kibToMib(m.peakKiB).padStart(9)} | ${mib(s?.rss).padStart(6)} ${mib(s?.heapTotal).padStart(8)} = ${mib(s?.newSpace).padStart(3)} + ${mib(s?.oldSpace).padStart(3)} + ${mib(s?.otherSpaces).padStart(5)} ${mib(s?.heapUsed).padStart(6)} ${mib(s?.external).padStart(9)} (${mib(s?.arrayBuffers)})${''.padStart(13 - mib(s?.arrayBuffers).length)} ${mib(s?.malloced, 1).padStart(9)} | ${mib(m.maxHeapUsed).padStart(13)}  ${String(m.maxTcp).padStart(15)}`)
    }
    const end = ends[i]
    console.log(`live V8 heap (lowest in use in any sample of the pass): ${mib(liveOf(pass), 1)} MiB; after pass ${i + 1}, idle 1 s: RSS ${kibToMib(end?.rssKiB)} MiB, V8 heap ${mib(end?.sample?.heapTotal)} MiB committed, ${mib(end?.sample?.heapUsed)} MiB used`)
  })

  console.log('')
  console.log('=== summary ===')
  const names = passes[0]!.map((r) => r.scenario.name)
  console.log(`scenario     ${passes.map((_, i) => `pass ${i + 1}: req/s (ratio)  peak RSS`.padEnd(34)).join('')}`)
  for (const name of names) {
    const cells = passes.map((pass) => {
      const r = pass.find((x) => x.scenario.name === name)!
      return `${fmt(r.tally.rps).padStart(7)} (${fmt(ratioOf(pass, r) * 100, 1).padStart(5)}%)  ${kibToMib(r.memory.peakKiB).padStart(7)} MiB`.padEnd(34)
    })
    console.log(`${name.padEnd(12)} ${cells.join('')}`)
  }
  const peaks = passes.map(peakOf)
  const limitKiB = rssLimitBytes / 1024
  console.log(`gateway peak RSS: at startup ${kibToMib(o.startupPeakKiB)} MiB, priming ${kibToMib(o.primedPeakKiB)} MiB; under load ${peaks.map((k, i) => `pass ${i + 1} ${kibToMib(k)} MiB`).join(', ')}`)
  const worst = Math.max(...peaks)
  console.log(`peak RSS < 200 MB (190.7 MiB): ${worst === 0 ? 'unknown (no /proc)' : worst < limitKiB ? 'met' : `MISSED (${kibToMib(worst)} MiB)`}${windowed ? '' : ' (VmHWM could not be reset: every figure is the peak since start)'}`)
  if (passes.length > 1) {
    // The live heap (the lowest heap in use sampled in a pass, i.e. just after a full GC) is
    // the leak signal; RSS once idle depends on whether a full GC happened to run before it
    // was read, and the peak moves with where the full GCs fall, so both are only shown.
    const live = passes.map(liveOf)
    const liveGrew = live.slice(1).some((b) => b > live[0]! * (1 + liveTolerance))
    const peakGrew = peaks.slice(1).some((k) => k > peaks[0]! * (1 + peakTolerance))
    const change = (a: number, b: number) => `${b >= a ? '+' : ''}${fmt(((b - a) / a) * 100, 1)}%`
    console.log(`growth between equal passes: live V8 heap (lowest in use) ${live.map((b) => mib(b, 1)).join(' -> ')} MiB (${change(live[0]!, live.at(-1)!)}); peak RSS ${peaks.map((k) => kibToMib(k)).join(' -> ')} MiB (${change(peaks[0]!, peaks.at(-1)!)}); RSS idle 1 s after each pass ${ends.map((e) => kibToMib(e.rssKiB)).join(' -> ')} MiB`)
    console.log(`RSS does not grow between equal passes (live heap within ${liveTolerance * 100}%, peak RSS within ${peakTolerance * 100}%): ${liveGrew || peakGrew ? `GREW (${[liveGrew ? 'live heap' : '', peakGrew ? 'peak RSS' : ''].filter(Boolean).join(' and ')})` : 'met'}`)
  }
  for (const pass of passes) {
    for (const r of pass) {
      const check = replayCheck(r)
      if (check && !check.ok) console.log(`replay check FAILED: ${r.scenario.name}: ${check.text}`)
    }
  }
  console.log(JSON.stringify({
    event: 'bench_result',
    store: store.description,
    connections: options.connections,
    duration_s: options.duration,
    warmup_s: options.warmup,
    gateway_node_options: options.gatewayNodeOptions,
    gateway_startup_peak_rss_kib: o.startupPeakKiB ?? null,
    gateway_priming_peak_rss_kib: o.primedPeakKiB ?? null,
    passes: passes.map((pass, i) => ({
      peak_rss_kib: peakOf(pass),
      live_heap_bytes: Number.isFinite(liveOf(pass)) ? liveOf(pass) : null,
      idle_rss_after_kib: ends[i]?.rssKiB ?? null,
      scenarios: pass.map((r) => ({
        name: r.scenario.name, requests: r.tally.requests, warmup_requests: r.warmup.requests, seconds: +r.tally.seconds.toFixed(2), rps: Math.round(r.tally.rps),
        p50_ms: +p(r, 50).toFixed(3), p99_ms: +p(r, 99).toFixed(3), non2xx: r.tally.non2xx, errors: r.tally.errors,
        replayed: r.tally.replayed, replay_check: replayCheck(r)?.ok ?? null,
        ratio: +ratioOf(pass, r).toFixed(3), target: r.scenario.target ?? null,
        baseline_rps: baseRuns(pass, r).map((b) => Math.round(b.tally.rps)),
        peak_rss_kib: r.memory.peakKiB ?? null,
        at_peak: r.memory.atPeak ?? null,
        cpu: Object.fromEntries(Object.entries(r.cpu).map(([k, v]) => [k, +v.toFixed(2)])),
        gateway_cpu_ms_per_request: +cpuPerRequest(r).toFixed(3),
      })),
    })),
  }))
}
