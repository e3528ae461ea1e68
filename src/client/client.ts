import { FencegateClientError } from './errors.js'
import { JobApi, monotonic, pause, problemOf, type FetchLike, type JsonAnswer } from './http.js'
import { maxWorkerIdLength, slotId, subjectOf, workerIdFor } from './identity.js'
import { Lease } from './lease.js'
import type { Job } from './types.js'
import { Slots } from './slots.js'
import { workLoop, type Claim, type Handler, type WorkOptions, type WorkResult } from './work.js'

/**
 * @example
 * new FencegateClient({ baseUrl: 'https://gateway.internal', token: process.env.FENCEGATE_TOKEN, requestTimeoutMs: 5000 })
 */
export interface FencegateClientOptions {
  /** The gateway's data plane, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string
  /**
   * A bearer token, sent to the gateway's own origin only. When it is a JWT with a `sub`, that
   * `sub` is the worker's id (the gateway takes the worker from it under `auth.mode: jwt`).
   */
  token?: string
  /**
   * The worker's id, when the token's `sub` should not be it as is. With such a token it must be
   * the `sub` or start with `sub + "/"`, else the constructor throws `worker_mismatch`.
   * Default: the token's `sub`; without one, `worker-<uuid>`.
   */
  workerId?: string
  /** Defaults to the global fetch. */
  fetch?: FetchLike
  /** Deadline for job API calls other than heartbeats (those get a third of the lease). Default 10 s. */
  requestTimeoutMs?: number
}

/**
 * @example
 * const claimed = await client.claim({ types: ['report'], wait: 5, workerId: 'w1' })
 */
export interface ClaimOptions {
  /** Job types to claim; all configured types when omitted. */
  types?: string[]
  /**
   * Seconds the server may wait for a job (0–30). Default 0. A gateway already holding its cap of
   * the tenant's waiting claims (`429 too_many_waiting_claims`) is asked again after its
   * `Retry-After` within this wait, and the claim then returns nothing rather than throwing.
   */
  wait?: number
  /** Default: the client's {@link FencegateClient.workerId}. Checked against the token's `sub` as there. */
  workerId?: string
}

/** One job of a claim's answer. */
interface ClaimAnswer {
  job_id: string
  /** The owner the server recorded, which every call under the lease must name. */
  worker_id?: unknown
  type: string
  payload: unknown
  fence: string
  attempt: number
  lease_ms?: unknown
  lease_remaining_ms?: unknown
  cursor_length?: unknown
}

const randomWorkerId = () => `worker-${crypto.randomUUID()}`

/**
 * The worker SDK for fencegate's job API. Runs in Node and in any runtime with
 * fetch, AbortController and timers.
 *
 * @example
 * const client = new FencegateClient({ baseUrl: 'http://127.0.0.1:8080' })
 * await client.start({ type: 'customer_health_report', key: 'acme:2026-08', payload: { account: 'acme' } })
 * await client.work({ types: ['customer_health_report'], concurrency: 4, signal }, async (job, lease) => {
 *   const res = await lease.step('fetch-data', () => lease.fetch(`${gateway}/crm/accounts/acme`, { method: 'POST' }))
 *   await lease.append({ fetched: res.status })
 *   return { ok: true }
 * })
 */
export class FencegateClient {
  private readonly api: JobApi
  private readonly requestTimeoutMs: number
  private readonly loops = new Set<Slots>()
  private readonly subject: string | undefined
  /**
   * The id this client claims as: the `workerId` option, else the token's `sub`, else a
   * random `worker-<uuid>` chosen once. The slots of `work()` are `<workerId>/slot-<n>`.
   *
   * @example
   * new FencegateClient({ baseUrl, token }).workerId // the token's sub, e.g. 'host-1'
   */
  readonly workerId: string

  constructor(options: FencegateClientOptions) {
    if (!/^https?:\/\//.test(options.baseUrl)) throw new FencegateClientError('invalid_option', 'baseUrl must be an http(s) URL')
    this.requestTimeoutMs = options.requestTimeoutMs ?? 10_000
    this.subject = subjectOf(options.token)
    this.workerId = workerIdFor(options.workerId, this.subject, randomWorkerId)
    this.api = new JobApi(options.baseUrl, options.token, options.fetch ?? ((input, init) => globalThis.fetch(input, init)))
  }

  /** Starts a job by its natural key, or joins the existing one (`created` tells which). */
  async start(job: { type: string; key: string; payload?: unknown; restart?: boolean }) {
    const answer = await this.api.ok('POST', '', job, this.requestTimeoutMs)
    return answer.body as { job_id: string; state: string; created?: boolean; joined?: boolean; result?: unknown }
  }

  /** Reads a job (with its chunks from `from` on, when given). */
  async getJob(jobId: string, from?: number) {
    const answer = await this.api.ok('GET', `/${encodeURIComponent(jobId)}${from === undefined ? '' : `?from=${from}`}`, undefined, this.requestTimeoutMs)
    return answer.body as Record<string, unknown> & { state: string; fence: string; result: unknown; chunks?: unknown[] }
  }

  /**
   * Claims one job and returns it with its running lease, or undefined when
   * none is claimable. The caller must end the lease: `complete`, `fail` or `release`.
   */
  async claim(options: ClaimOptions = {}): Promise<{ job: Job; lease: Lease } | undefined> {
    const [one] = await this.claimAs([this.idFor(options.workerId)], options)
    return one
  }

  /**
   * Claims up to `max` jobs (1–100) in one request, each with its own fence and lease;
   * an empty list when none is claimable. The caller must end every lease.
   *
   * @example
   * const claimed = await client.claimBatch({ types: ['report'], max: 10, wait: 5, workerId: 'w1' })
   */
  async claimBatch(options: ClaimOptions & { max: number }): Promise<{ job: Job; lease: Lease }[]> {
    if (!Number.isInteger(options.max) || options.max < 1 || options.max > 100) throw new FencegateClientError('invalid_option', 'max must be an integer from 1 to 100')
    return this.claimAs([this.idFor(options.workerId)], options, options.max)
  }

  /** A per-call workerId, held to the same rule as the client's own. */
  private idFor(workerId: string | undefined): string {
    return workerId === undefined ? this.workerId : workerIdFor(workerId, this.subject, () => this.workerId)
  }

  /**
   * One claim request. Without `max`, one job as `ids[0]`. With it, a batch: one id for all
   * jobs, or one per job (`worker_ids`: the slots of `work()`, each holding its own leases).
   */
  private async claimAs(ids: string[], options: ClaimOptions, max?: number): Promise<{ job: Job; lease: Lease }[]> {
    const who = ids.length > 1 ? { worker_ids: ids } : { worker_id: ids[0] }
    const body = { ...who, ...(max === undefined ? {} : { max }), ...(options.types ? { types: options.types } : {}) }
    const sent = await this.postClaim(body, options.wait ?? 0)
    const answered = sent?.answer.status === 204 ? undefined : sent?.answer.body
    if (!sent || !answered) return []
    const jobs = max === undefined ? [answered as unknown as ClaimAnswer] : Array.isArray(answered.jobs) ? (answered.jobs as ClaimAnswer[]) : []
    // The lease names the owner the server recorded; the id sent is the fallback for an answer without one.
    return jobs.map((c, i) => this.leased(c, typeof c.worker_id === 'string' ? c.worker_id : ids[Math.min(i, ids.length - 1)]!, sent.sentAt))
  }

  /**
   * Sends a claim that may wait `wait` seconds on the server. A gateway that already holds as
   * many waiting claims of the tenant as it allows answers `429 too_many_waiting_claims`: the
   * claim is sent again after its `Retry-After` with what is left of the wait, and when nothing
   * is left it ends with no job (undefined), as a wait that found none does, rather than throwing.
   */
  private async postClaim(body: Record<string, unknown>, wait: number): Promise<{ answer: JsonAnswer; sentAt: number } | undefined> {
    const end = monotonic() + wait * 1000
    for (let left = wait; ;) {
      const sentAt = monotonic()
      const answer = await this.api.call('POST', '/claim', { ...body, wait: left }, left * 1000 + this.requestTimeoutMs)
      if (answer.status >= 200 && answer.status < 300) return { answer, sentAt }
      if (answer.status !== 429 || answer.body?.code !== 'too_many_waiting_claims') throw problemOf(answer)
      const pauseMs = Math.min(answer.retryAfterMs ?? 1000, end - monotonic())
      if (pauseMs <= 0) return undefined
      await pause(pauseMs)
      // In whole milliseconds: `wait` is seconds, fractions allowed.
      left = Math.floor(end - monotonic()) / 1000
      if (left <= 0) return undefined
    }
  }

  private leased(c: ClaimAnswer, workerId: string, sentAt: number): { job: Job; lease: Lease } {
    const job: Job = { id: c.job_id, type: c.type, payload: c.payload, fence: c.fence, attempt: c.attempt }
    // lease_until is on the database clock, which this process cannot compare with its own; the durations
    // the claim statement computed can be, counted from when the claim was sent (see docs/workers.md).
    const lease = new Lease({
      api: this.api, jobId: job.id, fence: job.fence, workerId, attempt: job.attempt,
      leaseMs: intOrZero(c.lease_ms), remainingMs: intOrZero(c.lease_remaining_ms), claimSentAt: sentAt,
      cursor: intOrZero(c.cursor_length), requestTimeoutMs: this.requestTimeoutMs,
    })
    return { job, lease }
  }

  /**
   * Claims and runs jobs until `signal` aborts. Each job's result is completed
   * under its lease; a thrown error fails the attempt (retryably, except
   * PermanentFailure); a lost or cancelled lease commits nothing. A slot is free
   * again only once its handler settles: a handler that runs on after its lease
   * ended keeps the slot (`draining`), so hung handlers cannot pile up. Resolves
   * after shutdown with the jobs whose handlers never settled within the grace period.
   *
   * @example
   * const { unsettled } = await client.work({ types: ['report'], concurrency: 4, signal }, handler)
   */
  async work(options: WorkOptions, handler: Handler): Promise<WorkResult> {
    const concurrency = options.concurrency ?? 1
    if (!Number.isInteger(concurrency) || concurrency < 1) throw new FencegateClientError('invalid_option', 'concurrency must be a positive integer')
    const id = this.idFor(options.workerId)
    // One slot has nothing to tell apart: it claims as the worker id itself, as work() always has.
    const slot = (n: number) => (concurrency === 1 ? id : slotId(id, n))
    // The gateway takes worker ids of at most 255 characters: a long sub would fail every claim, forever.
    if (slot(concurrency).length > maxWorkerIdLength) throw new FencegateClientError('invalid_option', `the worker id ${JSON.stringify(id)} with its slot suffix ("/slot-${concurrency}") is over ${maxWorkerIdLength} characters, which the gateway refuses`)
    const base: ClaimOptions = { wait: options.claimWait ?? 5, ...(options.types ? { types: options.types } : {}) }
    // One slot claims one job at a time, as it always has; more claim in batches for the free slots,
    // each job under its own slot's id, so the server records which slot holds which lease.
    const claim: Claim = async (free) => {
      const ids = free.map(slot)
      const claimed = await this.claimAs(ids, base, concurrency === 1 ? undefined : ids.length)
      return claimed.map((c, i) => ({ ...c, slot: free[ids.indexOf(c.lease.workerId)] ?? free[i]! }))
    }
    const slots = new Slots(concurrency, options.onEvent ?? (() => undefined))
    this.loops.add(slots)
    try {
      return await workLoop(claim, slots, options, handler)
    } finally {
      this.loops.delete(slots)
    }
  }

  /**
   * Slots of this client's running `work()` loops that hold a handler whose lease has
   * ended (lost, cancelled or released) and which has not settled yet. Such a slot
   * claims nothing until its handler settles.
   *
   * @example
   * health.gauge('draining_slots', client.drainingSlots)
   */
  get drainingSlots(): number {
    let n = 0
    for (const slots of this.loops) n += slots.drainingCount
    return n
  }
}

/** A positive integer from an answer, else 0 (a lease of 0 starts lost rather than guessed). */
const intOrZero = (value: unknown): number => (Number.isSafeInteger(value) && (value as number) > 0 ? (value as number) : 0)

