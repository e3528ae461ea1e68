import { FencegateClientError, JobCancelled, LeaseLost, OwnershipUnknown, type LostReason } from './errors.js'
import { callUnderLease } from './holder-call.js'
import { monotonic, type JobApi, type JsonAnswer } from './http.js'
import type { LeaseInit, Ownership, StepOptions } from './types.js'

const stepName = /^[A-Za-z0-9_.:-]{1,128}$/

/**
 * One claimed job's lease, as its worker holds it. It renews itself on its own
 * timer (every third of the lease, each renewal with a deadline of a third),
 * moves its local deadline only after a confirmed renewal, and refuses to send
 * anything under the lease once it is lost.
 *
 * @example
 * await lease.step('fetch-data', () => lease.fetch(`${gateway}/crm/accounts/42`))
 * await lease.append({ rows: 120 })
 * await lease.complete({ score: 0.93 })
 */
export class Lease {
  readonly jobId: string
  readonly fence: string
  readonly workerId: string
  readonly attempt: number
  /** How many output chunks the job had when this lease began: a successor continues after them. */
  readonly cursor: number
  /** Aborts when the lease is lost, the job is cancelled or the worker releases it; `reason` says which. */
  readonly signal: AbortSignal
  /** Resolves when the lease ends for any reason but completion (with the same reason the signal carries). */
  readonly ended: Promise<LeaseLost | JobCancelled>
  /** Confirmed renewals so far. */
  renewals = 0

  private readonly api: JobApi
  private readonly interval: number
  private readonly requestTimeoutMs: number
  private readonly controller = new AbortController()
  private endedWith: LeaseLost | JobCancelled | undefined
  private resolveEnded!: (e: LeaseLost | JobCancelled) => void
  private state: Ownership = 'owner'
  private deadline: number
  private finished = false
  private nextSeq: number
  private appends: Promise<unknown> = Promise.resolve()
  private step_: { name: string; fetches: number; ifUnknown: 'wait' | 'throw' } | undefined
  private looseFetches = 0
  private waiters: (() => void)[] = []
  private beatTimer: ReturnType<typeof setTimeout> | undefined
  private deadlineTimer: ReturnType<typeof setTimeout> | undefined

  constructor(init: LeaseInit) {
    this.api = init.api
    this.jobId = init.jobId
    this.fence = init.fence
    this.workerId = init.workerId
    this.attempt = init.attempt
    this.cursor = init.cursor
    this.nextSeq = init.cursor
    this.interval = Math.max(1, Math.floor(init.leaseMs / 3))
    this.requestTimeoutMs = init.requestTimeoutMs
    this.signal = this.controller.signal
    this.ended = new Promise((resolve) => (this.resolveEnded = resolve))
    // The database measured what was left after we sent the claim, so this deadline is never later than the real one.
    this.deadline = init.claimSentAt + init.remainingMs
    // Without a confirmed lease there is nothing to hold: start lost rather than guess.
    if (init.leaseMs <= 0 || init.remainingMs <= 0) {
      this.lose('deadline')
      return
    }
    this.armDeadline()
    this.scheduleBeat()
  }

  /** The current state; reading it also notices a deadline that has passed. */
  get ownership(): Ownership {
    this.checkDeadline()
    return this.state
  }

  /** Resolves at the next change of `ownership`. */
  changed(): Promise<Ownership> {
    return new Promise((resolve) => this.waiters.push(() => resolve(this.state)))
  }

  /**
   * Runs one irreversible step. It starts only as owner: while ownership is
   * unknown it waits (or throws OwnershipUnknown), and once the lease is lost it
   * throws LeaseLost. `lease.fetch` calls inside it share the step's
   * idempotency key (`fg.<job>.<step>`, then `.1`, `.2` for later calls), so a
   * successor redoing the step gets the stored answers. Steps of one lease run
   * one at a time.
   */
  async step<T>(name: string, fn: () => T | Promise<T>, options: StepOptions = {}): Promise<T> {
    if (!stepName.test(name)) throw new FencegateClientError('invalid_step_name', 'a step name is 1-128 letters, digits, _ . : -')
    if (this.step_) throw new FencegateClientError('step_overlap', `step ${name} started while step ${this.step_.name} runs; steps of one lease run one at a time`)
    const step = { name, fetches: 0, ifUnknown: options.ifUnknown ?? 'wait' }
    this.step_ = step
    try {
      await this.ready(step.ifUnknown)
      return await fn()
    } finally {
      this.step_ = undefined
    }
  }

  /**
   * fetch with `X-Execution-Fence`, `X-Job-Id` and a stable `Idempotency-Key`
   * (one you set is kept), aborted when the lease ends. Not sent unless this
   * worker is the owner: it waits out an unknown ownership, and throws LeaseLost after loss.
   */
  async fetch(input: string | URL, init: RequestInit = {}): Promise<Response> {
    const url = String(input)
    const headers = new Headers(init.headers)
    // Taken before any await, so the n-th call of a step always gets the n-th key.
    if (!headers.has('idempotency-key')) headers.set('idempotency-key', this.nextKey())
    await this.ready(this.step_?.ifUnknown ?? 'wait')
    headers.set('x-execution-fence', this.fence)
    headers.set('x-job-id', this.jobId)
    this.api.authorize(url, headers)
    const signal = init.signal ? AbortSignal.any([this.signal, init.signal]) : this.signal
    return this.api.fetch(url, { ...init, headers, signal })
  }

  /** Appends one output chunk; sequence numbers are assigned in call order, and a retry resends the same chunk and number. */
  append(chunk: unknown): Promise<number> {
    const snapshot: unknown = JSON.parse(JSON.stringify(chunk ?? null))
    const sent = this.appends.then(() => this.sendAppend(snapshot))
    this.appends = sent.catch(() => undefined)
    return sent
  }

  /** Completes the job with `result` under this lease. Refused locally after loss; retried (a repeat is a no-op) on network failures. */
  async complete(result: unknown): Promise<void> {
    await this.appends
    await this.holderCall('complete', { result: result ?? null })
    this.finish()
  }

  /** Ends this attempt with an error; `retryable` lets the job be claimed again after backoff. Returns the job's new state. */
  async fail(error: unknown, retryable: boolean): Promise<string> {
    const answer = await this.holderCall('fail', { error: error ?? null, retryable }, true)
    this.finish()
    return String(answer.body?.state)
  }

  /**
   * Gives the job back: aborts the signal, stops renewing and releases the lease on
   * the server, which queues the job for another worker at once without counting
   * the attempt. If the release does not arrive, the job waits out its lease.
   */
  async release(): Promise<void> {
    if (this.endedWith || this.finished) return
    const reason = new LeaseLost(this.jobId, this.fence, 'released')
    this.end(reason, false)
    this.setState('lost')
    await this.send('release', {}).catch(() => undefined)
    this.resolveEnded(reason)
  }

  private async ready(ifUnknown: 'wait' | 'throw'): Promise<void> {
    for (;;) {
      this.checkDeadline()
      if (this.endedWith) throw this.endedWith
      if (this.finished) throw new FencegateClientError('lease_finished', `job ${this.jobId} is already finished under this lease`)
      if (this.state === 'owner') return
      if (ifUnknown === 'throw') throw new OwnershipUnknown(this.jobId)
      await this.changed()
    }
  }

  private nextKey(): string {
    const step = this.step_
    if (step) return `fg.${this.jobId}.${step.name}${step.fetches++ ? `.${step.fetches - 1}` : ''}`
    return `fg.${this.jobId}.fetch.${this.looseFetches++}`
  }

  private async sendAppend(chunk: unknown): Promise<number> {
    const seq = this.nextSeq
    await this.holderCall('append', { seq, chunk })
    this.nextSeq = seq + 1
    return seq
  }

  /** A call under the lease (src/client/holder-call.ts): refused after loss, retried on network failures and 5xx, 409s turned into loss. */
  private holderCall(action: 'append' | 'complete' | 'fail', body: Record<string, unknown>, allowCancelled = false): Promise<JsonAnswer> {
    return callUnderLease({
      check: (lastFailure) => {
        this.checkDeadline()
        // After a lost answer the outcome is unknown; say so rather than claim a loss that may not have mattered.
        if (this.endedWith && !(allowCancelled && this.endedWith instanceof JobCancelled)) throw lastFailure ?? this.endedWith
        if (this.finished) throw new FencegateClientError('lease_finished', `job ${this.jobId} is already finished under this lease`)
      },
      send: () => this.send(action, body),
      lose: (reason) => {
        this.lose(reason)
        return this.endedWith!
      },
    })
  }

  private send(action: string, body: Record<string, unknown>): Promise<JsonAnswer> {
    return this.api.call('POST', `/${this.jobId}/${action}`, { worker_id: this.workerId, fence: this.fence, ...body }, this.requestTimeoutMs)
  }

  private scheduleBeat(): void {
    this.beatTimer = setTimeout(() => void this.beat(), this.interval)
  }

  private async beat(): Promise<void> {
    if (this.endedWith || this.finished) return
    // The next renewal is due a third of the lease from now whatever this one does, and this one gives up by then.
    this.scheduleBeat()
    const sentAt = monotonic()
    let answer: JsonAnswer
    try {
      answer = await this.api.call('POST', `/${this.jobId}/heartbeat`, { worker_id: this.workerId, fence: this.fence }, this.interval)
    } catch {
      return this.unconfirmed()
    }
    this.checkDeadline()
    if (this.endedWith || this.finished) return
    const remaining = answer.body?.lease_remaining_ms
    if (answer.status === 200 && Number.isSafeInteger(remaining)) {
      // What was left at the database's now(), which came after we sent: counted from the send, a slow answer only shortens it.
      this.deadline = Math.max(this.deadline, sentAt + (remaining as number))
      this.renewals++
      this.armDeadline()
      this.setState('owner')
      if (answer.body?.cancel_requested === true) void this.cancelled()
      return
    }
    if (answer.status === 409 && answer.body?.code === 'lease_lost') return this.lose((answer.body.reason as LostReason | undefined) ?? 'expired')
    if (answer.status === 404) return this.lose('not_found')
    this.unconfirmed()
  }

  private unconfirmed(): void {
    this.checkDeadline()
    if (!this.endedWith && !this.finished) this.setState('unknown')
  }

  private async cancelled(): Promise<void> {
    const reason = new JobCancelled(this.jobId)
    this.end(reason, false)
    // A fail after a cancel request ends the job as cancelled; without it, the job waits for the lease to expire.
    await this.send('fail', { error: { code: 'job_cancelled' }, retryable: true }).catch(() => undefined)
    this.resolveEnded(reason)
  }

  private armDeadline(): void {
    clearTimeout(this.deadlineTimer)
    this.deadlineTimer = setTimeout(() => this.checkDeadline(), Math.max(0, this.deadline - monotonic()) + 1)
  }

  private checkDeadline(): void {
    if (!this.endedWith && !this.finished && monotonic() >= this.deadline) this.lose('deadline')
  }

  /** Marks the lease lost for good: nothing more is sent under it. */
  private lose(reason: LostReason): void {
    if (this.state === 'lost') return
    if (!this.endedWith) this.end(new LeaseLost(this.jobId, this.fence, reason))
    this.setState('lost')
  }

  /** Ends the lease: `ended` resolves now, or (`announce` false) once the caller has told the server. */
  private end(reason: LeaseLost | JobCancelled, announce = true): void {
    if (this.endedWith) return
    this.endedWith = reason
    this.stopTimers()
    this.controller.abort(reason)
    if (announce) this.resolveEnded(reason)
    if (reason instanceof LeaseLost) this.setState('lost')
  }

  private finish(): void {
    this.finished = true
    this.stopTimers()
  }

  private stopTimers(): void {
    clearTimeout(this.beatTimer)
    clearTimeout(this.deadlineTimer)
  }

  private setState(state: Ownership): void {
    if (this.state === state) return
    this.state = state
    for (const wake of this.waiters.splice(0)) wake()
  }
}
