import { FencegateClientError, GatewayUnreachable, JobCancelled, LeaseLost, PermanentFailure } from './errors.js'
import { pause } from './http.js'
import type { Lease } from './lease.js'
import type { Job } from './types.js'

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

/** A claimed job with its running lease. */
export interface Claimed {
  job: Job
  lease: Lease
}

/** Claims up to `max` jobs for the work loop (an empty list when none is claimable). */
export type Claim = (max: number) => Promise<Claimed[]>

type Emit = (e: WorkEvent) => void

/**
 * The loop behind `FencegateClient.work`: claims and runs jobs until `options.signal` aborts.
 * Above one job at a time it keeps one claim in flight, for as many jobs as there are free
 * slots (never more, so no claimed job waits with its lease running). Jobs that finish
 * while a claim is under way are refilled together by the next one, so a busy worker
 * claims in batches and an idle one long-polls once, not once per slot.
 */
export async function workLoop(claim: Claim, concurrency: number, options: WorkOptions, handler: Handler): Promise<void> {
  const emit: Emit = options.onEvent ?? (() => undefined)
  const running = new Set<Promise<void>>()
  // The claim itself is not aborted on shutdown: an aborted claim may still take a job on the server, which
  // would then sit unowned until its lease expires. Its answer is awaited and released instead.
  for (let failures = 0; !options.signal.aborted;) {
    const free = concurrency - running.size
    if (free === 0) {
      await Promise.race(running)
      continue
    }
    let claimed: Claimed[]
    try {
      claimed = await claim(Math.min(free, 100))
      failures = 0
    } catch (err) {
      emit({ type: 'error', code: err instanceof FencegateClientError ? err.code : 'error' })
      await pause(Math.min(100 * 2 ** failures++, 5000), options.signal)
      continue
    }
    for (const { job, lease } of claimed) {
      if (await admit(job, lease, options, emit) !== 'run') continue
      const done: Promise<void> = run(job, lease, handler, options, emit).finally(() => running.delete(done))
      running.add(done)
    }
  }
  await Promise.all(running)
}

async function run(job: Job, lease: Lease, handler: Handler, options: WorkOptions, emit: Emit): Promise<void> {
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
