import autocannon from 'autocannon'

/** What varies from one request to the next. */
export interface Outgoing {
  path: string
  headers?: Record<string, string>
}

export interface LoadSpec {
  url: string
  connections: number
  /**
   * Requests to send, split evenly over the connections. A count, not a duration:
   * a timed run ends by destroying connections with requests in flight, and a
   * client leaving mid-response crashes this gateway (see docs/benchmarks.md).
   */
  amount: number
  /** Stops the run (in-flight requests and all) if it has not finished by then. */
  maxSeconds: number
  /** Called once per request: its path (the entity) and any headers of its own (an Idempotency-Key). */
  request: () => Outgoing
  /** Headers every request carries. */
  headers: Record<string, string>
  body: Buffer
  signal: AbortSignal
}

/**
 * Latencies in ~1% log buckets: bounded memory for any duration, sub-millisecond
 * resolution (autocannon's own histogram keeps whole milliseconds only).
 */
class Histogram {
  private static readonly growth = Math.log(1.01)
  private readonly counts = new Float64Array(2400)
  private total = 0

  record(ms: number): void {
    const us = Math.max(1, ms * 1000)
    const i = Math.min(this.counts.length - 1, Math.floor(Math.log(us) / Histogram.growth))
    this.counts[i]! += 1
    this.total += 1
  }

  /** The percentile in ms, as the geometric middle of its bucket. */
  percentile(p: number): number {
    if (this.total === 0) return NaN
    const rank = Math.ceil((p / 100) * this.total)
    let seen = 0
    for (let i = 0; i < this.counts.length; i++) {
      seen += this.counts[i]!
      if (seen >= rank) return Math.exp((i + 0.5) * Histogram.growth) / 1000
    }
    return NaN
  }
}

/** What one or more runs added up to. */
export class Tally {
  readonly latencies = new Histogram()
  requests = 0
  /** Time with load applied: first request sent to last response, summed over runs. */
  seconds = 0
  non2xx = 0
  /** Non-2xx responses by status, to tell stale fences (409) from store failures (503). */
  readonly statuses: Record<string, number> = {}
  errors = 0
  timeouts = 0
  /** Responses carrying `idempotent-replayed: true`: answered from the store, not the upstream. */
  replayed = 0

  get rps(): number {
    return this.seconds > 0 ? this.requests / this.seconds : 0
  }
}

/**
 * Sends `amount` requests (at most `maxSeconds`) and adds them to `tally`.
 * Resolves with this run's own requests per second.
 */
export function runLoad(spec: LoadSpec, tally: Tally): Promise<number> {
  const amount = Math.max(spec.amount, spec.connections)
  // Timed here, to the last response: autocannon's own duration ends at a tick.
  const started = performance.now()
  let last = started
  let responses = 0
  let replayed = 0
  return new Promise((resolve, reject) => {
    const instance = autocannon({
      url: spec.url,
      connections: spec.connections,
      pipelining: 1,
      amount,
      // autocannon notices the end of a run only at a sample tick (default every 1 s).
      sampleInt: 50,
      timeout: 10,
      method: 'POST',
      headers: spec.headers,
      body: spec.body,
      requests: [{
        // autocannon builds every request afresh (headers copied) when setupRequest is given.
        setupRequest: (request) => {
          const next = spec.request()
          request.path = next.path
          if (next.headers) request.headers = { ...request.headers, ...next.headers }
          return request
        },
        // Raw header names as the gateway sent them; its names are lower-case, but do not rely on it.
        onResponse: (_status, _body, _context, headers) => {
          if (isReplayed(headers)) replayed++
        },
      }],
    }, (err, result) => {
      spec.signal.removeEventListener('abort', stop)
      clearTimeout(deadline)
      if (err) return reject(err)
      const seconds = (last - started) / 1000
      tally.requests += responses
      tally.replayed += replayed
      tally.seconds += seconds
      tally.non2xx += result.non2xx
      tally.errors += result.errors
      tally.timeouts += result.timeouts
      resolve(seconds > 0 ? responses / seconds : 0)
    })
    const stop = () => instance.stop()
    const deadline = setTimeout(stop, spec.maxSeconds * 1000)
    spec.signal.addEventListener('abort', stop, { once: true })
    instance.on('response', (_client, status, _bytes, ms) => {
      last = performance.now()
      tally.latencies.record(ms)
      if (status < 200 || status > 299) tally.statuses[status] = (tally.statuses[status] ?? 0) + 1
      responses++
    })
  })
}

function isReplayed(headers: Record<string, unknown> | undefined): boolean {
  for (const [name, value] of Object.entries(headers ?? {})) {
    if (name.toLowerCase() === 'idempotent-replayed') return String(value) === 'true'
  }
  return false
}
