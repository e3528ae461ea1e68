import { FencegateClientError, GatewayUnreachable, PermanentFailure, type LeaseLost } from './errors.js'
import { pause } from './http.js'
import type { Lease } from './lease.js'
import { endedBy, type Slots, type SlotEvent } from './slots.js'
import type { Job } from './types.js'

/**
 * @example
 * await client.work({ types: ['report'], concurrency: 4, signal, shutdownGraceMs: 30_000, onEvent: (e) => log(e) }, handler)
 */
export interface WorkOptions {
  types?: string[]
  /** Jobs run at once. Default 1. */
  concurrency?: number
  /**
   * Aborting it stops claiming; running and draining handlers get `shutdownGraceMs` to settle. Then the jobs
   * still running are released, and `work()` resolves without waiting further, naming the handlers that never settled.
   */
  signal: AbortSignal
  /**
   * Default: the client's `workerId` (the token's `sub`). Each slot claims as `<workerId>/slot-<n>`,
   * n from 1 to `concurrency`; under auth `workerId` must be the token's `sub` or start with `sub + "/"`.
   */
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
  | SlotEvent

/**
 * A handler runs one job under its lease; what it returns is the job's result.
 *
 * @example
 * const handler: Handler = async (job, lease) => ({ id: job.id, fence: lease.fence })
 */
export type Handler<P = unknown> = (job: Job<P>, lease: Lease) => unknown

/** A claimed job with its running lease, and the slot (1 to concurrency) whose id it was claimed under. */
export interface Claimed {
  job: Job
  lease: Lease
  slot: number
}

/** Claims a job for each of the `free` slots at most (an empty list when none is claimable). */
export type Claim = (free: number[]) => Promise<Claimed[]>

type Emit = (e: WorkEvent) => void

/**
 * What `work()` resolves with once it has shut down.
 *
 * @example
 * const { unsettled } = await client.work({ types: ['report'], signal }, handler)
 * if (unsettled.length) log.warn('handlers still running after the grace period', unsettled)
 */
export interface WorkResult {
  /** Jobs whose handlers had not settled when the grace period ended (their leases released or already gone). */
  unsettled: string[]
}

/**
 * The loop behind `FencegateClient.work`: claims and runs jobs until `options.signal` aborts.
 * Above one job at a time it keeps one claim in flight, for as many jobs as there are free
 * slots (never more, so no claimed job waits with its lease running). Jobs that finish
 * while a claim is under way are refilled together by the next one, so a busy worker
 * claims in batches and an idle one long-polls once, not once per slot. A slot is free
 * only once its handler settles, so handlers that ignore a lost lease cannot pile up.
 */
export async function workLoop(claim: Claim, slots: Slots, options: WorkOptions, handler: Handler): Promise<WorkResult> {
  const emit: Emit = options.onEvent ?? (() => undefined)
  const running = new Set<Promise<void>>()
  const unsettled: string[] = []
  // The numbers of the slots that run nothing. A slot is taken from its claim until its handler settles.
  const idle = Array.from({ length: slots.size }, (_, i) => i + 1)
  // Kept in order, so the lowest free slots claim first and a worker's owners stay slot-1, slot-2, ….
  const giveBack = (...free: number[]) => {
    idle.push(...free)
    idle.sort((a, b) => a - b)
  }
  // The claim itself is not aborted on shutdown: an aborted claim may still take a job on the server, which
  // would then sit unowned until its lease expires. Its answer is awaited and released instead.
  for (let failures = 0; !options.signal.aborted;) {
    if (idle.length === 0) {
      await Promise.race(running)
      continue
    }
    const asked = idle.splice(0, 100)
    let claimed: Claimed[]
    try {
      claimed = await claim(asked)
      failures = 0
    } catch (err) {
      giveBack(...asked)
      emit({ type: 'error', code: err instanceof FencegateClientError ? err.code : 'error' })
      await pause(Math.min(100 * 2 ** failures++, 5000), options.signal)
      continue
    }
    giveBack(...asked.filter((n) => !claimed.some((c) => c.slot === n)))
    for (const { job, lease, slot } of claimed) {
      if (await admit(job, lease, options, emit) !== 'run') {
        giveBack(slot)
        continue
      }
      const done: Promise<void> = run(job, lease, handler, { options, emit, slots })
        .then((settled) => void (settled || unsettled.push(job.id)))
        .finally(() => {
          running.delete(done)
          giveBack(slot)
        })
      running.add(done)
    }
  }
  await Promise.all(running)
  return { unsettled }
}

interface RunContext {
  options: WorkOptions
  emit: Emit
  slots: Slots
}

type Outcome = { ok: true; value: unknown } | { ok: false; error: unknown }

/** Runs one job; resolves true once its handler has settled, false if shutdown gave up on it first. */
async function run(job: Job, lease: Lease, handler: Handler, ctx: RunContext): Promise<boolean> {
  const settled: Promise<Outcome> = Promise.resolve()
    .then(() => handler(job, lease))
    .then((value) => ({ ok: true as const, value }), (error: unknown) => ({ ok: false as const, error }))
  const grace = shutdownGrace(ctx.options, lease)
  try {
    const outcome = await Promise.race([settled, lease.ended.then(() => undefined)])
    if (outcome && !lease.signal.aborted) {
      // Settled under a live lease: the grace period no longer applies, and a release now would race the completion.
      grace.dispose()
      await commit(job, lease, outcome, ctx.emit)
      return true
    }
    // work() resolves only once the job is given back, so a process may exit right after it.
    await grace.released()
    // A cancel or a release is told to the server before \`ended\` resolves: without this wait, work() could
    // resolve (and the process exit) before the fail that ends a cancelled job had arrived.
    await lease.ended
    reportEnded(job, lease, ctx.emit)
    if (outcome) return true
    if (grace.over()) return false
    return await drain(job, lease, settled, grace.expired, ctx.slots)
  } finally {
    grace.dispose()
  }
}

/**
 * The lease ended while the handler runs. Nothing more is sent under it, but the slot stays
 * taken until the handler settles, or until the shutdown grace period ends (false).
 */
async function drain(job: Job, lease: Lease, settled: Promise<Outcome>, graceOver: Promise<void>, slots: Slots): Promise<boolean> {
  // A handler that stops on lease.signal has settled by the next turn of the event loop: it never drains.
  const soon = new Promise<void>((r) => setTimeout(r, 0))
  if (await Promise.race([settled.then(() => true), soon.then(() => false)])) return true
  slots.drain(job, endedBy(lease))
  if (!(await Promise.race([settled.then(() => true), graceOver.then(() => false)]))) return false
  slots.drained(job)
  return true
}

/** The handler's outcome, sent under the lease: its result completes the job, its error fails the attempt. */
async function commit(job: Job, lease: Lease, outcome: Outcome, emit: Emit): Promise<void> {
  try {
    if (outcome.ok) {
      await lease.complete(outcome.value)
      emit({ type: 'completed', jobId: job.id, fence: job.fence })
    } else {
      const state = await lease.fail(errorRecord(outcome.error), !(outcome.error instanceof PermanentFailure))
      emit({ type: 'failed', jobId: job.id, fence: job.fence, state })
    }
  } catch (err) {
    if (lease.signal.aborted && !(err instanceof GatewayUnreachable)) return reportEnded(job, lease, emit)
    emit({ type: 'error', jobId: job.id, fence: job.fence, code: err instanceof FencegateClientError ? err.code : 'error' })
  }
}

/** The event for a lease that ended before its job could be completed: `cancelled`, `released` or `lost`, with the reason. */
function reportEnded(job: Job, lease: Lease, emit: Emit): void {
  const why = endedBy(lease)
  if (why === 'cancelled') emit({ type: 'cancelled', jobId: job.id, fence: job.fence, reason: 'cancelled' })
  else emit({ type: why, jobId: job.id, fence: job.fence, reason: (lease.signal.reason as LeaseLost).reason })
}

/**
 * The shutdown grace period of one job: once `signal` aborts, the handler has `shutdownGraceMs`;
 * then the lease is released (if it still runs) and the worker stops waiting for the handler.
 */
function shutdownGrace(options: WorkOptions, lease: Lease) {
  let timer: ReturnType<typeof setTimeout> | undefined
  let over = false
  let released: Promise<void> | undefined
  let markOver!: () => void
  const expired = new Promise<void>((r) => (markOver = r))
  const start = () => {
    timer = setTimeout(() => {
      over = true
      released = lease.release()
      markOver()
    }, options.shutdownGraceMs ?? 10_000)
  }
  if (options.signal.aborted) start()
  else options.signal.addEventListener('abort', start, { once: true })
  return {
    /** Resolves when the grace period ends (never, without a shutdown). */
    expired,
    over: () => over,
    released: () => released,
    dispose: () => {
      clearTimeout(timer)
      options.signal.removeEventListener('abort', start)
    },
  }
}

/**
 * What becomes of a job the worker just claimed: given back at once on shutdown, dropped when
 * its lease was already lost, else run. Emits the matching event either way.
 */
async function admit(job: Job, lease: Lease, options: WorkOptions, emit: Emit): Promise<'run' | 'shutdown' | 'lost'> {
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
