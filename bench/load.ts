// The load generators: Debian's wrk (one thread, a Lua script for per-request variation;
// much cheaper per request than a Node load generator, so it is not the bottleneck), or
// autocannon when wrk is not on PATH. Both run for a time, with `connections` open.
import { spawn, spawnSync } from 'node:child_process'
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import autocannon from 'autocannon'
import { cpuSeconds } from './procs.js'
import { baseHeaders, requestBody, requests, wrkScript, type Traffic } from './traffic.js'

export interface LoadResult {
  requests: number
  seconds: number
  rps: number
  p50ms: number
  p99ms: number
  /** Responses with a status other than 2xx (wrk: status >= 400). */
  non2xx: number
  /** Connect, read, write errors and timeouts. */
  errors: number
  /** CPU seconds of the load generator itself (wrk: its process; autocannon: this process). */
  cpuSeconds: number
}

export interface LoadSpec {
  url: string
  connections: number
  seconds: number
  traffic: Traffic
  /** Where wrk's script is written. */
  dir: string
  signal: AbortSignal
}

export type LoadGenerator = 'wrk' | 'autocannon'

export function wrkAvailable(): boolean {
  return spawnSync('wrk', ['--version'], { encoding: 'utf8' }).error === undefined
}

export function runLoad(kind: LoadGenerator, spec: LoadSpec): Promise<LoadResult> {
  return kind === 'wrk' ? runWrk(spec) : runAutocannon(spec)
}

let scripts = 0

async function runWrk(spec: LoadSpec): Promise<LoadResult> {
  const script = join(spec.dir, `load-${scripts++}.lua`)
  writeFileSync(script, wrkScript(spec.traffic))
  const args = ['-t1', `-c${spec.connections}`, `-d${spec.seconds}s`, '--timeout', '10s', '-s', script, spec.url]
  const child = spawn('wrk', args, { stdio: ['ignore', 'pipe', 'pipe'] })
  let out = ''
  child.stdout.on('data', (c: Buffer) => { out += c.toString('utf8') })
  child.stderr.on('data', (c: Buffer) => { out += c.toString('utf8') })
  // wrk's own CPU, sampled until it exits (the last sample is at most 200 ms short).
  let cpu = 0
  const sample = setInterval(() => { cpu = Math.max(cpu, cpuSeconds(child.pid!)) }, 200)
  const stop = () => child.kill('SIGINT')
  spec.signal.addEventListener('abort', stop, { once: true })
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve))
  clearInterval(sample)
  spec.signal.removeEventListener('abort', stop)
  const m = /BENCH_RESULT (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)/.exec(out)
  if (code !== 0 || !m) throw new Error(`wrk ${args.join(' ')} failed (exit ${code}):\n${out.slice(-2000)}`)
  const [requests, durationUs, connect, read, write, status, timeout, p50, p99] = m.slice(1).map(Number) as number[]
  const seconds = durationUs! / 1e6
  return {
    requests: requests!, seconds, rps: requests! / seconds, p50ms: p50! / 1000, p99ms: p99! / 1000,
    non2xx: status!, errors: connect! + read! + write! + timeout!, cpuSeconds: cpu,
  }
}

/** Latencies in ~1% log buckets (autocannon's own histogram keeps whole milliseconds only). */
class Histogram {
  private static readonly growth = Math.log(1.01)
  private readonly counts = new Float64Array(2400)
  private total = 0

  record(ms: number): void {
    const us = Math.max(1, ms * 1000)
    this.counts[Math.min(this.counts.length - 1, Math.floor(Math.log(us) / Histogram.growth))]! += 1
    this.total += 1
  }

  percentile(p: number): number {
    const rank = Math.ceil((p / 100) * this.total)
    let seen = 0
    for (let i = 0; i < this.counts.length; i++) {
      seen += this.counts[i]!
      if (seen >= rank && seen > 0) return Math.exp((i + 0.5) * Histogram.growth) / 1000
    }
    return NaN
  }
}

function runAutocannon(spec: LoadSpec): Promise<LoadResult> {
  const next = requests(spec.traffic)
  const latencies = new Histogram()
  let responses = 0
  let non2xx = 0
  const started = performance.now()
  let last = started
  const cpuBefore = process.cpuUsage()
  return new Promise((resolve, reject) => {
    const instance = autocannon({
      url: spec.url,
      connections: spec.connections,
      pipelining: 1,
      duration: spec.seconds,
      timeout: 10,
      method: 'POST',
      headers: baseHeaders(spec.traffic),
      body: requestBody,
      requests: [{
        setupRequest: (request) => {
          const o = next()
          request.path = o.path
          request.headers = { ...request.headers, ...o.headers }
          if (o.body !== undefined) request.body = o.body
          return request
        },
      }],
    }, (err, result) => {
      spec.signal.removeEventListener('abort', stop)
      if (err) return reject(err)
      const seconds = (last - started) / 1000
      const cpu = process.cpuUsage(cpuBefore)
      resolve({
        requests: responses, seconds, rps: seconds > 0 ? responses / seconds : 0,
        p50ms: latencies.percentile(50), p99ms: latencies.percentile(99),
        non2xx, errors: result.errors + result.timeouts, cpuSeconds: (cpu.user + cpu.system) / 1e6,
      })
    })
    const stop = () => instance.stop()
    spec.signal.addEventListener('abort', stop, { once: true })
    instance.on('response', (_client, status, _bytes, ms) => {
      last = performance.now()
      latencies.record(ms)
      if (status < 200 || status > 299) non2xx++
      responses++
    })
  })
}
