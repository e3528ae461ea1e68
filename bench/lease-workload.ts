// The workload every system in `npm run bench -- leases` runs: no-op jobs, `concurrency`
// jobs in flight at most, either drained from a queue seeded beforehand or fed by
// producers that keep about `backlog` jobs waiting (the steady regime).

/** One queue as a fencegate worker sees it: over HTTP or on the store in this process. */
export interface FencegateSteps {
  /** Up to `max` jobs; `wait` seconds of long poll where the system has one. */
  claim(worker: string, max: number, wait: number): Promise<{ jobId: string; fence: string }[]>
  complete(worker: string, job: { jobId: string; fence: string }): Promise<boolean>
  /** Starts one job (a producer's step). */
  start(key: string): Promise<void>
}

/** Counts finished jobs and lets producers wait for room below the backlog. */
export class Progress {
  /** Jobs a producer has taken a number for (started or starting). */
  reserved = 0
  /** Jobs whose start has committed. */
  produced = 0
  completed = 0
  private waiting: (() => void)[] = []
  constructor(readonly total: number, readonly backlog: number) {}

  done(n = 1): void {
    this.completed += n
    for (const wake of this.waiting.splice(0)) wake()
  }

  /** Resolves once fewer than `backlog` jobs are produced and not yet completed. */
  async room(): Promise<void> {
    while (this.reserved - this.completed >= this.backlog) await new Promise<void>((r) => this.waiting.push(r))
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/**
 * Fencegate workers: `concurrency / batch` loops, each claiming up to `batch` jobs per
 * claim and completing them together, so at most `concurrency` jobs are in flight.
 * Draining (no producers) ends at the first empty claim; in the steady regime a loop
 * ends at an empty claim once every job has been produced, and otherwise waits (the
 * HTTP claim long-polls on the gateway's LISTEN; the store has none, so it retries after 5 ms).
 */
export async function fencegateWorkers(steps: FencegateSteps, o: { concurrency: number; batch: number; prefix: string; progress: Progress; steady: boolean; longPoll: boolean; signal: AbortSignal }): Promise<number> {
  let refused = 0
  const loops = Math.max(1, Math.floor(o.concurrency / o.batch))
  const work = (w: number) => workLoop(`${o.prefix}.w${w}`)
  const workLoop = async (worker: string) => {
    while (!o.signal.aborted) {
      const allProduced = o.progress.produced >= o.progress.total
      const jobs = await steps.claim(worker, o.batch, o.steady && o.longPoll && !allProduced ? 1 : 0)
      if (jobs.length === 0) {
        if (!o.steady || allProduced) return
        if (!o.longPoll) await sleep(5)
        continue
      }
      const results = await Promise.all(jobs.map((job) => steps.complete(worker, job)))
      refused += results.filter((ok) => !ok).length
      o.progress.done(jobs.length)
    }
  }
  await Promise.all(Array.from({ length: loops }, (_, w) => work(w)))
  // A claim can come back empty while another claim holds a job it will not take (both
  // candidates locked, one taken): a last loop picks up anything left behind that way.
  if (o.progress.completed < o.progress.total) await workLoop(`${o.prefix}.sweep`)
  return refused
}

/** `count` producers starting jobs one at a time, each waiting for room below the backlog. */
export async function producers(count: number, progress: Progress, start: (n: number) => Promise<void>, signal: AbortSignal): Promise<void> {
  await Promise.all(Array.from({ length: count }, async () => {
    while (progress.reserved < progress.total && !signal.aborted) {
      await progress.room()
      if (progress.reserved >= progress.total) return
      await start(progress.reserved++)
      progress.produced++
    }
  }))
}
