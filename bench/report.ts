// The side-by-side table (medians over interleaved rounds, every ratio taken within a
// round), the targets checked against it, and one JSON line with every sample.
import { caseNamed, type Case, type CaseId } from './cases.js'
import type { Sample } from './measure.js'

export type Results = Map<CaseId, Sample[]>

/** The "150 MB", read strictly: 150,000,000 bytes (143.1 MiB). */
export const rssLimitBytes = 150e6

const median = (values: number[]): number => {
  const v = values.filter(Number.isFinite).sort((a, b) => a - b)
  if (v.length === 0) return NaN
  const mid = v.length >> 1
  return v.length % 2 ? v[mid]! : (v[mid - 1]! + v[mid]!) / 2
}
const fmt = (n: number, digits = 0) => (Number.isFinite(n) ? n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits }) : '–')
const pct = (r: number) => (Number.isFinite(r) ? `${fmt(r * 100)}%` : '–')

const perRequestUs = (s: Sample, seconds: number) => (s.load.requests > 0 ? (seconds / s.load.requests) * 1e6 : NaN)
const proxyUs = (s: Sample) => perRequestUs(s, s.cpu.proxy)
const postgresUs = (s: Sample) => perRequestUs(s, s.cpu.postgres)

/** Median over rounds of f(this round's sample of `a`, the same round's sample of `b`). */
function paired(results: Results, a: CaseId, b: CaseId, f: (x: Sample, y: Sample) => number): number {
  const xs = results.get(a) ?? []
  const ys = results.get(b) ?? []
  return median(xs.map((x) => {
    const y = ys.find((s) => s.round === x.round)
    return y ? f(x, y) : NaN
  }))
}
const rpsRatio = (results: Results, a: CaseId, b: CaseId) => paired(results, a, b, (x, y) => x.load.rps / y.load.rps)

export interface Row {
  c: Case
  rps: number
  vsBare: number
  vsHand: number
  p50: number
  p99: number
  proxyUs: number
  postgresUs: number
  non2xx: number
  errors: number
  /** PostgreSQL connections the system's processes held at the end of its runs (the most seen). */
  connections: number
}

/** One row per case of `ran` that has samples, in that order. */
export function rows(results: Results, ran: readonly Case[]): Row[] {
  return ran.filter((c) => results.has(c.name)).map((c) => {
    const s = results.get(c.name)!
    return {
      c,
      rps: median(s.map((x) => x.load.rps)),
      vsBare: rpsRatio(results, c.name, 'bare-node'),
      vsHand: rpsRatio(results, c.name, c.hand),
      p50: median(s.map((x) => x.load.p50ms)),
      p99: median(s.map((x) => x.load.p99ms)),
      proxyUs: median(s.map(proxyUs)),
      postgresUs: usesStore(c) ? median(s.map(postgresUs)) : NaN,
      non2xx: s.reduce((n, x) => n + x.load.non2xx, 0),
      errors: s.reduce((n, x) => n + x.load.errors, 0),
      connections: usesStore(c) ? Math.max(...s.map((x) => x.connections)) : NaN,
    }
  })
}

const usesStore = (c: Case) => c.system === 'hand' || c.system === 'gateway' || c.system === 'gateway-workers'

export function table(rs: Row[]): string[] {
  const lines = [
    '| case | req/s | vs bare Node | vs hand-rolled | p50 ms | p99 ms | CPU µs/req, proxy | PostgreSQL CPU µs/req | PostgreSQL connections | non-2xx | errors |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for (const r of rs) {
    const hand = usesStore(r.c) && Number.isFinite(r.vsHand) ? `${pct(r.vsHand)} of ${r.c.hand}` : '–'
    lines.push(`| ${r.c.name}: ${r.c.label} | ${fmt(r.rps)} | ${pct(r.vsBare)} | ${hand} | ${fmt(r.p50, 2)} | ${fmt(r.p99, 2)} | ${fmt(r.proxyUs)} | ${fmt(r.postgresUs)} | ${fmt(r.connections)} | ${r.non2xx} | ${r.errors} |`)
  }
  return lines
}

/** What else ran during each case (medians, in cores), to tell whether the load generator or the upstream limited it. */
export function context(results: Results, ran: readonly Case[]): string[] {
  const lines = ['cores in use, medians:  upstream  load gen  postgres (this run / all on the machine)  machine busy']
  for (const c of ran) {
    const s = results.get(c.name)
    if (!s) continue
    const cores = (f: (x: Sample) => number) => fmt(median(s.map((x) => f(x) / x.load.seconds)), 2)
    lines.push(`${c.name.padEnd(22)}  ${cores((x) => x.cpu.upstream).padStart(8)}  ${cores((x) => x.cpu.load).padStart(8)}  ${cores((x) => x.cpu.postgres).padStart(8)} / ${cores((x) => x.cpu.postgresAll).padEnd(30)}  ${fmt(median(s.map((x) => x.cpu.machineBusy)), 2)}`)
  }
  return lines
}

export interface TargetCheck {
  target: string
  measured: string
  met: boolean | undefined
}

export function targets(results: Results, ran: readonly Case[], peakRssKiB: number | undefined, defaults: boolean): TargetCheck[] {
  const out: TargetCheck[] = []
  const has = (...names: CaseId[]) => names.every((n) => results.has(n))
  const atLeast = (target: string, a: CaseId, b: CaseId, min: number) => {
    const r = has(a, b) ? rpsRatio(results, a, b) : NaN
    out.push({ target, measured: pct(r), met: Number.isFinite(r) ? r >= min : undefined })
  }
  const cpuAtMost = (target: string, a: CaseId, b: CaseId, f: (s: Sample) => number, max: number) => {
    const r = has(a, b) ? paired(results, a, b, (x, y) => f(x) / f(y)) : NaN
    out.push({ target, measured: Number.isFinite(r) ? `${fmt(r, 2)}×` : '–', met: Number.isFinite(r) ? r <= max : undefined })
  }
  atLeast('fg-off req/s >= 85% of bare-node', 'fg-off', 'bare-node', 0.85)
  cpuAtMost('fg-off gateway CPU/req <= 1.3x bare-node\'s', 'fg-off', 'bare-node', proxyUs, 1.3)
  atLeast('fg-spread req/s >= 100% of hand-fence', 'fg-spread', 'hand-fence', 1)
  cpuAtMost('fg-spread PostgreSQL CPU/req <= 1.1x hand-fence\'s', 'fg-spread', 'hand-fence', postgresUs, 1.1)
  atLeast('fg-hot req/s >= 100% of hand-hot', 'fg-hot', 'hand-hot', 1)
  atLeast('fg-key req/s >= 100% of hand-key', 'fg-key', 'hand-key', 1)
  // Issue 29: a key read from the body costs no more than the header's, plus the body's one parse.
  atLeast('fg-key-body req/s >= 95% of fg-key', 'fg-key-body', 'fg-key', 0.95)
  // Issue 28: a raise on every command (its history row included) as cheap as the hand-rolled fence.
  atLeast('fg-raise req/s >= 90% of hand-fence', 'fg-raise', 'hand-fence', 0.9)
  cpuAtMost('fg-raise PostgreSQL CPU/req <= 1.3x hand-fence\'s', 'fg-raise', 'hand-fence', postgresUs, 1.3)
  // Issue 42: a fenced, keyed MCP tools/call costs the gateway within 1.3x of a REST command with a key.
  cpuAtMost('fg-mcp gateway CPU/call <= 1.3x fg-key\'s', 'fg-mcp', 'fg-key', proxyUs, 1.3)
  // The same bound against the same calls on a REST route with a key, same MCP server, same load:
  // what MCP's reading adds, without the batching the MCP server's CPU takes from the gateway.
  cpuAtMost('fg-mcp gateway CPU/call <= 1.3x fg-mcp-rest\'s', 'fg-mcp', 'fg-mcp-rest', proxyUs, 1.3)
  cpuAtMost('fg-mcp-upstream gateway CPU/call <= 1.3x fg-key\'s (the MCP route without an MCP server on the cores)', 'fg-mcp-upstream', 'fg-key', proxyUs, 1.3)
  atLeast('fg-replay req/s >= 80% of bare-node', 'fg-replay', 'bare-node', 0.8)
  cpuAtMost('fg-replay PostgreSQL CPU/req <= hand-fence\'s', 'fg-replay', 'hand-fence', postgresUs, 1)
  // Issue 28: on this 2-core machine, two workers serve 1.25x one worker's fg-spread at no
  // more than 1.1x its gateway CPU per request.
  const spreadWorkers = ran.find((c) => c.single === 'fg-spread')
  if (spreadWorkers) {
    atLeast(`${spreadWorkers.name} req/s >= 125% of fg-spread`, spreadWorkers.name, 'fg-spread', 1.25)
    cpuAtMost(`${spreadWorkers.name} gateway CPU/req <= 1.1x fg-spread's`, spreadWorkers.name, 'fg-spread', proxyUs, 1.1)
  }
  // Issue 31: traced at 100%, within 15% of the same case untraced in req/s.
  for (const c of ran) {
    if (c.untraced) atLeast(`${c.name} req/s >= 85% of ${c.untraced} (issue 31's goal at 100% sampling)`, c.name, c.untraced, 0.85)
  }
  // Issue 43: the embedded store (what `npm start` runs) serves at least 75% of PostgreSQL's req/s.
  for (const c of ran) {
    if (c.onPostgres) atLeast(`${c.name} req/s >= 75% of ${c.onPostgres} (the embedded store against PostgreSQL)`, c.name, c.onPostgres, 0.75)
  }
  for (const c of ran) {
    if (c.p99Of) cpuAtMost(`${c.name} p99 <= 2x ${c.p99Of}'s`, c.name, c.p99Of, (s) => s.load.p99ms, 2)
  }
  const limitKiB = rssLimitBytes / 1024
  out.push({
    target: `gateway peak RSS < 150 MB (143.1 MiB)${defaults ? ', no Node flags' : ' (NOT the defaults: --gateway-node-options was given)'}`,
    measured: peakRssKiB === undefined ? '–' : `${fmt(peakRssKiB / 1024, 1)} MiB`,
    met: peakRssKiB === undefined || !results.has('fg-off') && !results.has('fg-spread') ? undefined : peakRssKiB < limitKiB && defaults,
  })
  return out
}

/** Each traced case beside its untraced one in the same rounds: req/s ratio and gateway CPU per request. */
export function tracingCost(results: Results, ran: readonly Case[]): string[] {
  const lines = ['tracing cost (medians over rounds; ratios within each round):']
  for (const c of ran) {
    if (!c.untraced || !results.has(c.name) || !results.has(c.untraced)) continue
    const rps = rpsRatio(results, c.name, c.untraced)
    const cpu = paired(results, c.name, c.untraced, (x, y) => proxyUs(x) / proxyUs(y))
    const us = (n: CaseId) => fmt(median((results.get(n) ?? []).map(proxyUs)))
    lines.push(`  ${c.name}: req/s ${pct(rps)} of ${c.untraced}; gateway CPU ${us(c.name)} vs ${us(c.untraced)} µs/req (${fmt(cpu, 2)}×)`)
  }
  return lines
}

export function printTargets(checks: TargetCheck[]): string[] {
  return checks.map((t) => `${t.met === undefined ? 'not measured' : t.met ? 'met   ' : 'MISSED'}  ${t.target}: ${t.measured}`)
}

export function resultJson(results: Results, extra: Record<string, unknown>): string {
  return JSON.stringify({
    event: 'bench_result',
    ...extra,
    cases: Object.fromEntries([...results].map(([name, s]) => [name, s.map((x) => ({
      round: x.round, rps: Math.round(x.load.rps), requests: x.load.requests, seconds: +x.load.seconds.toFixed(2),
      p50_ms: +x.load.p50ms.toFixed(3), p99_ms: +x.load.p99ms.toFixed(3), non2xx: x.load.non2xx, errors: x.load.errors,
      cpu_s: Object.fromEntries(Object.entries(x.cpu).map(([k, v]) => [k, +v.toFixed(2)])),
      proxy_cpu_us_per_request: Math.round(proxyUs(x)), postgres_cpu_us_per_request: Math.round(postgresUs(x)), postgres_connections: x.connections,
    }))])),
  })
}

export { caseNamed }
