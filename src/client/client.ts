import { FencegateClientError, GatewayUnreachable, JobCancelled, LeaseLost, PermanentFailure } from './errors.js'
import { JobApi, monotonic, pause, type FetchLike } from './http.js'
import { Lease } from './lease.js'

/**
 * @example
 * new FencegateClient({ baseUrl: 'https://gateway.internal', token: process.env.FENCEGATE_TOKEN, requestTimeoutMs: 5000 })
 */
export interface FencegateClientOptions {
  /** The gateway's data plane, e.g. `http://127.0.0.1:8080`. */
  baseUrl: string
  /** A bearer token, sent to the gateway's own origin only. */
  token?: string
  /** Defaults to the global fetch. */
  fetch?: FetchLike
  /** Deadline for job API calls other than heartbeats (those get a third of the lease). Default 10 s. */
  requestTimeoutMs?: number
}

/**
 * A claimed job, as the handler sees it.
 *
 * @example
 * const { account } = job.payload as { account: string }
 */
export interface Job<P = unknown> {
  id: string
  type: string
  payload: P
  fence: string
  attempt: number
}

/**
 * @example
 * const claimed = await client.claim({ types: ['report'], wait: 5, workerId: 'w1' })
 */
export interface ClaimOptions {
  /** Job types to claim; all configured types when omitted. */
  types?: string[]
  /** Seconds the server may wait for a job (0–30). Default 0. */
  wait?: number
  workerId?: string
}

/**
 * @example
 * await client.work({ types: ['report'], concurrency: 4, signal, shutdownGraceMs: 30_000, onEvent: (e) => log(e) }, handler)
 */
export interface WorkOptions {
  types?: string[]
  /** Jobs run at once. Default 1. */
  concurrency?: number
  /** Aborting it stops claiming; in-flight jobs get `shutdownGraceMs` to finish, then are released. */
  signal: AbortSignal
  workerId?: string
  /** Default 10 s. */
  shutdownGraceMs?: number
  /** How long one claim may wait on the server for work, in seconds. Shutdown can take this long. Default 5. */
  claimWait?: number
  /** Called for every outcome: how to log or count what the worker does. */
  onEvent?: (event: WorkEvent) => void
}

/**
 * What happened to a job the worker claimed: identifiers and codes only.
 *
 * @example
 * onEvent: (e) => { if (e.type === 'lost') metrics.lost.inc({ reason: e.reason }) }
 */
export type WorkEvent =
  | { type: 'claimed' | 'completed'; jobId: string; fence: string }
  | { type: 'failed'; jobId: string; fence: string; state: string }
  | { type: 'lost' | 'cancelled' | 'released'; jobId: string; fence: string; reason: string }
  | { type: 'error'; jobId?: string; fence?: string; code: string }

/**
 * A handler runs one job under its lease; what it returns is the job's result.
 *
 * @example
 * const handler: Handler = async (job, lease) => ({ id: job.id, fence: lease.fence })
 */
export type Handler<P = unknown> = (job: Job<P>, lease: Lease) => unknown

/** One job of a claim's answer. */
interface ClaimAnswer {
  job_id: string
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

  constructor(options: FencegateClientOptions) {
    if (!/^https?:\/\//.test(options.baseUrl)) throw new FencegateClientError('invalid_option', 'baseUrl must be an http(s) URL')
    this.requestTimeoutMs = options.requestTimeoutMs ?? 10_000
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
    const workerId = options.workerId ?? randomWorkerId()
    const wait = options.wait ?? 0
    const sentAt = monotonic()
    const answer = await this.api.ok('POST', '/claim', { worker_id: workerId, wait, ...(options.types ? { types: options.types } : {}) }, wait * 1000 + this.requestTimeoutMs)
    if (answer.status === 204 || !answer.body) return undefined
    return this.leased(answer.body as unknown as ClaimAnswer, workerId, sentAt)
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
    const workerId = options.workerId ?? randomWorkerId()
    const wait = options.wait ?? 0
    const sentAt = monotonic()
    const body = { worker_id: workerId, wait, max: options.max, ...(options.types ? { types: options.types } : {}) }
    const answer = await this.api.ok('POST', '/claim', body, wait * 1000 + this.requestTimeoutMs)
    if (answer.status === 204 || !answer.body) return []
    const jobs = Array.isArray(answer.body.jobs) ? (answer.body.jobs as ClaimAnswer[]) : []
    return jobs.map((c) => this.leased(c, workerId, sentAt))
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
   * PermanentFailure); a lost or cancelled lease commits nothing.
   */
  async work(options: WorkOptions, handler: Handler): Promise<void> {
    const concurrency = options.concurrency ?? 1
    if (!Number.isInteger(concurrency) || concurrency < 1) throw new FencegateClientError('invalid_option', 'concurrency must be a positive integer')
    const workerId = options.workerId ?? randomWorkerId()
    const emit = options.onEvent ?? (() => undefined)
    if (concurrency === 1) return this.slot(options, workerId, handler, emit)
    return this.batches(concurrency, options, workerId, handler, emit)
  }

  /**
   * Above one job at a time: one claim in flight, for as many jobs as there are free
   * slots (never more, so no claimed job waits with its lease running). Jobs that finish
   * while a claim is under way are refilled together by the next one, so a busy worker
   * claims in batches and an idle one long-polls once, not once per slot.
   */
  private async batches(concurrency: number, options: WorkOptions, workerId: string, handler: Handler, emit: (e: WorkEvent) => void): Promise<void> {
    const running = new Set<Promise<void>>()
    for (let failures = 0; !options.signal.aborted;) {
      const free = concurrency - running.size
      if (free === 0) {
        await Promise.race(running)
        continue
      }
      let claimed: Awaited<ReturnType<FencegateClient['claimBatch']>>
      try {
        claimed = await this.claimBatch({ workerId, wait: options.claimWait ?? 5, max: Math.min(free, 100), ...(options.types ? { types: options.types } : {}) })
        failures = 0
      } catch (err) {
        emit({ type: 'error', code: err instanceof FencegateClientError ? err.code : 'error' })
        await pause(Math.min(100 * 2 ** failures++, 5000), options.signal)
        continue
      }
      for (const { job, lease } of claimed) {
        if (await admit(job, lease, options, emit) !== 'run') continue
        const done: Promise<void> = this.run(job, lease, handler, options, emit).finally(() => running.delete(done))
        running.add(done)
      }
    }
    await Promise.all(running)
  }

  private async slot(options: WorkOptions, workerId: string, handler: Handler, emit: (e: WorkEvent) => void): Promise<void> {
    // The claim itself is not aborted on shutdown: an aborted claim may still take a job on the server, which
    // would then sit unowned until its lease expires. Its answer is awaited and released instead.
    for (let failures = 0; !options.signal.aborted;) {
      let claimed: Awaited<ReturnType<FencegateClient['claim']>>
      try {
        claimed = await this.claim({ workerId, wait: options.claimWait ?? 5, ...(options.types ? { types: options.types } : {}) })
        failures = 0
      } catch (err) {
        emit({ type: 'error', code: err instanceof FencegateClientError ? err.code : 'error' })
        await pause(Math.min(100 * 2 ** failures++, 5000), options.signal)
        continue
      }
      if (!claimed) continue
      const { job, lease } = claimed
      const admitted = await admit(job, lease, options, emit)
      if (admitted === 'shutdown') return
      if (admitted === 'lost') continue
      await this.run(job, lease, handler, options, emit)
    }
  }

  private async run(job: Job, lease: Lease, handler: Handler, options: WorkOptions, emit: (e: WorkEvent) => void): Promise<void> {
    const settled = Promise.resolve()
      .then(() => handler(job, lease))
      .then((value) => ({ ok: true as const, value }), (error: unknown) => ({ ok: false as const, error }))
    let grace: ReturnType<typeof setTimeout> | undefined
    let released: Promise<void> | undefined
    const onShutdown = () => {
      grace = setTimeout(() => (released = lease.release()), options.shutdownGraceMs ?? 10_000)
    }
    if (options.signal.aborted) onShutdown()
    else options.signal.addEventListener('abort', onShutdown, { once: true })
    // A handler that ignores its signal keeps running after the lease ends, but the slot moves on and nothing it does is sent.
    const outcome = await Promise.race([settled, lease.ended.then(() => undefined)])
    clearTimeout(grace)
    options.signal.removeEventListener('abort', onShutdown)
    // work() resolves only once the job is given back, so a process may exit right after it.
    await released
    const ended = () => {
      const reason = lease.signal.reason as LeaseLost | JobCancelled
      if (reason instanceof JobCancelled) emit({ type: 'cancelled', jobId: job.id, fence: job.fence, reason: 'cancelled' })
      else emit({ type: reason.reason === 'released' ? 'released' : 'lost', jobId: job.id, fence: job.fence, reason: reason.reason })
    }
    if (!outcome || lease.signal.aborted) return ended()
    try {
      if (outcome.ok) {
        await lease.complete(outcome.value)
        emit({ type: 'completed', jobId: job.id, fence: job.fence })
      } else {
        const state = await lease.fail(errorRecord(outcome.error), !(outcome.error instanceof PermanentFailure))
        emit({ type: 'failed', jobId: job.id, fence: job.fence, state })
      }
    } catch (err) {
      if (lease.signal.aborted && !(err instanceof GatewayUnreachable)) return ended()
      emit({ type: 'error', jobId: job.id, fence: job.fence, code: err instanceof FencegateClientError ? err.code : 'error' })
    }
  }
}

/** A positive integer from an answer, else 0 (a lease of 0 starts lost rather than guessed). */
const intOrZero = (value: unknown): number => (Number.isSafeInteger(value) && (value as number) > 0 ? (value as number) : 0)

/**
 * What becomes of a job the worker just claimed: given back at once on shutdown, dropped when
 * its lease was already lost, else run. Emits the matching event either way.
 */
async function admit(job: Job, lease: Lease, options: WorkOptions, emit: (e: WorkEvent) => void): Promise<'run' | 'shutdown' | 'lost'> {
  if (options.signal.aborted) {
    await lease.release()
    emit({ type: 'released', jobId: job.id, fence: job.fence, reason: 'shutdown' })
    return 'shutdown'
  }
  emit({ type: 'claimed', jobId: job.id, fence: job.fence })
  if (lease.ownership === 'lost') {
    emit({ type: 'lost', jobId: job.id, fence: job.fence, reason: (lease.signal.reason as LeaseLost).reason })
    return 'lost'
  }
  return 'run'
}

/** What a failed attempt records: the error's name and code, and the message only for SDK errors, whose text is known not to carry data. */
function errorRecord(error: unknown): Record<string, string> {
  if (error instanceof FencegateClientError) return { name: error.name, code: error.code, message: error.message }
  if (error instanceof Error) {
    const code: unknown = (error as Error & { code?: unknown }).code
    return { name: error.name, ...(typeof code === 'string' ? { code } : {}) }
  }
  return { name: 'non-error' }
}
