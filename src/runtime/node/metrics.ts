import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client'
import type { Metrics, MetricsExposition, StoreGauges } from '../../observe/metrics.js'
import type { WakeStats } from '../../leases/wake.js'

/** Seconds; from a fast local statement to an upstream near its timeout. */
const latencyBuckets = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
/** Seconds; lease lengths run from seconds to minutes. */
const leaseBuckets = [0.1, 0.5, 1, 2.5, 5, 10, 15, 30, 45, 60, 120, 300, 600]

export interface PromMetrics extends Metrics, MetricsExposition {
  /** The registry behind it (its own, never prom-client's global one). */
  readonly registry: Registry
  /**
   * Reports the waiting claims' wake-ups at scrape time (src/leases/wake.ts):
   * `fencegate_job_claim_wakes{reason}` (`notified` by a NOTIFY, `fallback_poll` by the shared
   * tick, `reconnected`) and `fencegate_job_listen_active` and `fencegate_job_claims_waiting`, this process's own.
   */
  watchClaimWake(stats: () => WakeStats): void
}

export interface PromMetricsOptions {
  /** Reads the database's counts, once per scrape. */
  readGauges?: () => Promise<StoreGauges>
  /** The version of the rules requests are judged by now, read once per scrape. */
  ruleVersion?: () => number
  /**
   * With `server.workers > 1`: every worker's counters and histograms summed by the
   * supervisor (src/runtime/node/cluster-worker.ts). The gauges read at scrape time (the
   * database's counts, the rules version, durability) are this worker's reading, once.
   */
  aggregate?: () => Promise<string>
  /** The store's durability level now (src/store/durability.ts), read once per scrape. */
  durability?: () => 'replicated' | 'local' | 'unknown'
  onGaugeError?: (err: unknown) => void
}

/**
 * Metrics for Node on prom-client, in a registry of their own so two gateways
 * in one process (tests, embedding) never share or clash. The gauges whose
 * truth lives elsewhere (the database's counts, the rules version) are read
 * at scrape time.
 *
 * @example
 * const metrics = createPromMetrics({ readGauges: () => readStoreGauges(db) })
 * const admin = createAdminApp({ store, metrics })
 */
export function createPromMetrics(options: PromMetricsOptions = {}): PromMetrics {
  const registry = new Registry()
  const registers = [registry]
  collectDefaultMetrics({ register: registry })
  // What is read at scrape time is true of the whole gateway once: never summed over workers.
  const local = new Registry()
  const locals = [local]
  const ruleVersion = options.ruleVersion
  // 1 for the level the store stands on now, 0 for the others (src/store/durability.ts).
  if (options.durability) {
    const durability = options.durability
    new Gauge({ name: 'fencegate_store_durability', help: 'What the store can lose: 1 for the current level (replicated: a synchronous standby confirms commits; local; unknown)', labelNames: ['level'], registers: locals, collect() {
      const now = durability()
      for (const level of ['replicated', 'local', 'unknown'] as const) this.set({ level }, level === now ? 1 : 0)
    } })
  }
  if (ruleVersion) new Gauge({ name: 'fencegate_rules_version', help: 'Version of the rules new requests are judged by', registers: locals, collect() { this.set(ruleVersion()) } })
  const refreshGauges = storeGauges(locals, options)
  const adminRequests = new Counter({ name: 'fencegate_admin_requests_total', help: 'Admin-plane requests by endpoint pattern and status', labelNames: ['endpoint', 'status'], registers })
  const purged = new Counter({ name: 'fencegate_rows_purged_total', help: 'Rows deleted by the periodic purge, by table (idempotency: expired keys; audit, fence_history: past their retention)', labelNames: ['table'], registers })
  return {
    registry,
    contentType: registry.contentType,
    async render() {
      await refreshGauges()
      const shared = options.aggregate ? await options.aggregate() : await registry.metrics()
      return shared + await local.metrics()
    },
    ...dataPlaneMetrics(registers),
    ...leaseMetrics(registers),
    adminRequest: (e) => adminRequests.inc({ endpoint: e.endpoint, status: String(e.status) }),
    rowsPurged: (e) => purged.inc({ table: e.table }, e.rows),
    watchClaimWake: (stats) => watchClaimWake(locals, stats),
  }
}

/** The wake's counters, read at scrape time: how waiting claims learn of work, notification or poll. */
function watchClaimWake(registers: Registers, stats: () => WakeStats): void {
  new Gauge({ name: 'fencegate_job_claim_wakes', help: 'Wake-ups of waiting claims since start, by reason (notified: a NOTIFY; fallback_poll: a shared poll on the tick; reconnected: the LISTEN came back)', labelNames: ['reason'], registers, collect() {
    const s = stats()
    this.set({ reason: 'notified' }, s.notified)
    this.set({ reason: 'fallback_poll' }, s.ticks)
    this.set({ reason: 'reconnected' }, s.reconnects)
  } })
  new Gauge({ name: 'fencegate_job_claims_waiting', help: 'Claims with wait blocked in this process now, until a wake-up', registers, collect() {
    this.set(stats().waiting)
  } })
  new Gauge({ name: 'fencegate_job_listen_active', help: '1 while this process LISTENs for job wake-ups (0 behind a transaction pooler without store.listen_url, or before the first waiting claim)', registers, collect() {
    this.set(stats().listening ? 1 : 0)
  } })
}

type Registers = Registry[]

/** The data plane's series: requests, their time, the upstream's and the store's, accepted fences. */
function dataPlaneMetrics(registers: Registers): Pick<Metrics, 'request' | 'upstream' | 'storeCall' | 'highestFenceUpdated'> {
  const requests = new Counter({ name: 'fencegate_requests_total', help: 'Data-plane requests by route, outcome (forwarded, replayed, rejected) and problem code', labelNames: ['route', 'outcome', 'code'], registers })
  const requestSeconds = new Histogram({ name: 'fencegate_request_duration_seconds', help: 'Data-plane time to decide and answer (to the response headers), by route and outcome', labelNames: ['route', 'outcome'], buckets: latencyBuckets, registers })
  const upstreamSeconds = new Histogram({ name: 'fencegate_upstream_duration_seconds', help: 'Upstream time to response headers per forward attempt, answered or not, by route', labelNames: ['route'], buckets: latencyBuckets, registers })
  const storeSeconds = new Histogram({ name: 'fencegate_store_duration_seconds', help: 'Store statement latency by call and result (ok, error)', labelNames: ['call', 'result'], buckets: latencyBuckets, registers })
  const fenceUpdates = new Counter({ name: 'fencegate_highest_fence_updates_total', help: 'Fences accepted as their entity\'s highest fence (replays included), by route', labelNames: ['route'], registers })
  // A label left out is absent from the series, which reads better than an empty value.
  const routeLabel = (route: string | undefined) => (route === undefined ? {} : { route })
  // The hot path's series, each labelled child made once: prom-client hashes and validates
  // the labels on every call otherwise (6% of a passthrough's CPU in the bench's profile).
  const requestCount = labelled((route: string | undefined, outcome: string, code: string | undefined) => requests.labels({ ...routeLabel(route), outcome, ...(code ? { code } : {}) }))
  const requestTime = labelled((route: string | undefined, outcome: string) => requestSeconds.labels({ ...routeLabel(route), outcome }))
  const upstreamTime = labelled((route: string) => upstreamSeconds.labels({ route }))
  const storeTime = labelled((call: string, result: string) => storeSeconds.labels({ call, result }))
  return {
    request(e) {
      requestCount(e.route, e.outcome, e.code).inc()
      requestTime(e.route, e.outcome).observe(e.durationMs / 1000)
    },
    upstream: (e) => upstreamTime(e.route).observe(e.durationMs / 1000),
    storeCall: (e) => storeTime(e.call, e.failed ? 'error' : 'ok').observe(e.durationMs / 1000),
    highestFenceUpdated: (e) => fenceUpdates.inc({ route: e.route }),
  }
}

/** The lease service's series: claims, releases, heartbeats and refusals, the job purge. */
function leaseMetrics(registers: Registers): Pick<Metrics, 'jobClaimed' | 'jobReleased' | 'jobsPurged' | 'heartbeat' | 'renewalFailed' | 'resultRejected'> {
  const claims = new Counter({ name: 'fencegate_job_claims_total', help: 'Jobs claimed, by type (reclaims included)', labelNames: ['type'], registers })
  const releases = new Counter({ name: 'fencegate_job_releases_total', help: 'Jobs given back by their live owner (release), by type', labelNames: ['type'], registers })
  const jobsPurged = new Counter({ name: 'fencegate_jobs_purged_total', help: 'Finished jobs deleted with their output after job_retention', registers })
  const reclaims = new Counter({ name: 'fencegate_job_reclaims_total', help: 'Claims of a running job whose lease had expired, by type', labelNames: ['type'], registers })
  const renewalFailures = new Counter({ name: 'fencegate_lease_renewal_failures_total', help: 'Refused heartbeats by reason', labelNames: ['reason'], registers })
  const heartbeatAge = new Histogram({ name: 'fencegate_heartbeat_age_seconds', help: 'Time since the lease was last set (claim or heartbeat) when a heartbeat renewed it, by type', labelNames: ['type'], buckets: leaseBuckets, registers })
  const remainingLease = new Histogram({ name: 'fencegate_lease_remaining_seconds', help: 'Lease left when a heartbeat renewed it, by type', labelNames: ['type'], buckets: leaseBuckets, registers })
  const resultRejections = new Counter({ name: 'fencegate_job_result_rejections_total', help: 'Refused completions by reason', labelNames: ['reason'], registers })
  return {
    jobClaimed(e) {
      claims.inc({ type: e.type })
      if (e.reclaimed) reclaims.inc({ type: e.type })
    },
    jobReleased: (e) => releases.inc({ type: e.type }),
    jobsPurged: (count) => jobsPurged.inc(count),
    heartbeat(e) {
      heartbeatAge.observe({ type: e.type }, e.ageMs / 1000)
      remainingLease.observe({ type: e.type }, e.remainingMs / 1000)
    },
    renewalFailed: (e) => renewalFailures.inc({ reason: e.reason }),
    resultRejected: (e) => resultRejections.inc({ reason: e.reason }),
  }
}

/** The gauges whose truth is in the database, and the refresh that reads them once per scrape. */
function storeGauges(registers: Registers, options: PromMetricsOptions): () => Promise<void> {
  const idempotency = new Gauge({ name: 'fencegate_idempotency_records', help: 'Unexpired idempotency records by state, read at scrape time', labelNames: ['state'], registers })
  const jobs = new Gauge({ name: 'fencegate_jobs', help: 'Jobs by type and state, read at scrape time', labelNames: ['type', 'state'], registers })
  const expired = new Gauge({ name: 'fencegate_jobs_lease_expired', help: 'Running jobs whose lease has expired by the database clock and that no one has reclaimed yet, read at scrape time', labelNames: ['type'], registers })
  const gaugeFailures = new Counter({ name: 'fencegate_gauge_read_failures_total', help: 'Scrapes whose database gauges could not be read (they are then left out)', registers })
  return async () => {
    if (!options.readGauges) return
    let gauges: StoreGauges | undefined
    try {
      gauges = await options.readGauges()
    } catch (err) {
      gaugeFailures.inc()
      options.onGaugeError?.(err)
    }
    // Reset first: a state or type that emptied, or a failed read, must not report an old count.
    for (const g of [idempotency, jobs, expired]) g.reset()
    if (!gauges) return
    for (const r of gauges.idempotency) idempotency.set({ state: r.state }, r.count)
    for (const r of gauges.jobs) {
      jobs.set({ type: r.type, state: r.state }, r.count)
      if (r.state === 'running') expired.set({ type: r.type }, r.expired)
    }
  }
}

type LabelValue = string | undefined

/** A cache of labelled children by their label values (absent ones included); `make` runs once per set. */
function labelled<V extends LabelValue[], C>(make: (...values: V) => C): (...values: V) => C {
  const children = new Map<string, C>()
  return (...values) => {
    // \u0001 stands for an absent value, so that it differs from an empty one.
    const key = values.map((v) => v ?? '\u0001').join('\u0000')
    let child = children.get(key)
    if (child === undefined) {
      child = make(...values)
      children.set(key, child)
    }
    return child
  }
}
