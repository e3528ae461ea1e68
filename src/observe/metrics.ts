import { watchCalls } from './watch-calls.js'
import type { ProblemCode } from '../http/problems.js'
import type { Db } from '../store/db.js'

/** How a data-plane request ended: sent upstream, answered from a stored response, or refused. */
export type RequestOutcome = 'forwarded' | 'replayed' | 'rejected'

/**
 * The events the data plane, the admin plane and the lease API report. The
 * core only calls these; each runtime decides what they become (prom-client on
 * Node, nothing on Workers). Labels are route names, job types, codes and
 * reasons, all bounded by the configuration or the code: never an entity, a
 * key, a tenant or a job id, whose numbers grow with traffic.
 */
export interface Metrics {
  /** One data-plane decision; `route` is undefined when no route matched. */
  request(e: { route: string | undefined; outcome: RequestOutcome; code?: ProblemCode; durationMs: number }): void
  /** One forward attempt, answered or not, timed to the upstream's response headers. */
  upstream(e: { route: string; durationMs: number }): void
  /** One store statement, timed at the edge of the Store or JobStore (see `instrument`). */
  storeCall(e: { call: string; durationMs: number; failed: boolean }): void
  /** A fence was accepted and written as its entity's highest (first, higher or equal fence). */
  highestFenceUpdated(e: { route: string }): void
  /** A job was claimed; `reclaimed` when it was running on a lease that had expired. */
  jobClaimed(e: { type: string; reclaimed: boolean }): void
  /** A live owner gave a job back (release): queued again without using up an attempt. */
  jobReleased(e: { type: string }): void
  /** Finished jobs deleted by retention (job_retention). */
  jobsPurged(count: number): void
  /** A heartbeat renewed a lease: how old the lease was and how much of it was left. */
  heartbeat(e: { type: string; ageMs: number; remainingMs: number }): void
  /** A heartbeat was refused. */
  renewalFailed(e: { reason: string }): void
  /** A completion was refused (not the live owner and fence). */
  resultRejected(e: { reason: string }): void
  /** One admin-plane request, by its route pattern (`/entities/:entity`). */
  adminRequest(e: { endpoint: string; status: number }): void
  /** Rows deleted by the periodic purge: expired keys, or audit and fence history past their retention. */
  rowsPurged(e: { table: 'idempotency' | 'audit' | 'fence_history'; rows: number }): void
}

/** What `GET /metrics` serves: a runtime's rendering of its metrics. */
export interface MetricsExposition {
  readonly contentType: string
  render(): Promise<string>
}

/**
 * Metrics that record nothing: the default wherever none are injected.
 *
 * @example
 * const app = createApp({ config, store, forward, metrics: noMetrics })
 */
export const noMetrics: Metrics = {
  request() {},
  upstream() {},
  storeCall() {},
  highestFenceUpdated() {},
  jobClaimed() {},
  jobReleased() {},
  jobsPurged() {},
  heartbeat() {},
  renewalFailed() {},
  resultRejected() {},
  adminRequest() {},
  rowsPurged() {},
}

/**
 * Wraps every method of a store so each call reports its duration, named by
 * the method (`reserve`, `claimOne`). Timing at the edge keeps timers out of
 * the statements; `close` is not a statement and is left alone, and a method
 * that returns no promise is passed through as it is.
 *
 * @example
 * const store = instrument(createStore(db), metrics)
 * const jobs = instrument(createJobStore(db), metrics)
 */
export function instrument<S extends object>(store: S, metrics: Metrics): S {
  // Only calls that go to the database return a promise; anything else passes through untimed.
  return watchCalls(store, (call) => {
    const started = performance.now()
    return (failed) => metrics.storeCall({ call, durationMs: performance.now() - started, failed })
  }, 'skip')
}

/** Counts read at scrape time, across tenants (tenants are never a label). */
export interface StoreGauges {
  /** Unexpired idempotency records by state (`in_flight`, `completed`, `outcome_unknown`, `not_replayable`). */
  idempotency: { state: string; count: number }[]
  /** Jobs by type and state, and running jobs whose lease has expired by the database clock. */
  jobs: { type: string; state: string; count: number; expired: number }[]
}

/**
 * Reads the scrape-time gauges: two aggregate queries, expiry judged by the
 * database clock. They scan their tables, so they run once per scrape, never per request.
 *
 * @example
 * const { jobs } = await readStoreGauges(db)
 */
export async function readStoreGauges(db: Db): Promise<StoreGauges> {
  const [idempotency, jobs] = await Promise.all([
    db.sql<{ state: string; count: number }>`
      SELECT state, count(*)::integer AS count FROM fg_idempotency WHERE expires_at > now() GROUP BY state`,
    db.sql<{ type: string; state: string; count: number; expired: number }>`
      SELECT type, state, count(*)::integer AS count,
             (count(*) FILTER (WHERE state = 'running' AND lease_until <= now()))::integer AS expired
      FROM fg_jobs GROUP BY type, state`,
  ])
  return { idempotency, jobs }
}
