// The systems `npm run bench -- leases` compares: fencegate's job store called in this
// process, fencegate's job API over HTTP (a gateway child process), and graphile-worker
// (in this process), each on its own fresh database of the same PostgreSQL server.
import { Logger, makeWorkerUtils, run, runMigrations, type WorkerUtils } from 'graphile-worker'
import pg from 'pg'
import type { Pool as HttpPool } from 'undici'
import type { JobType } from '../src/config/schema.js'
import type { JobStore } from '../src/leases/store.js'
import type { Db } from '../src/store/db.js'
import { fencegateWorkers, producers, Progress, type FencegateSteps } from './lease-workload.js'

export const jobTypeName = 'bench'

export interface Run {
  total: number
  concurrency: number
  signal: AbortSignal
  /** Producers for the steady regime; undefined when the queue was seeded. */
  steady?: { producers: number; backlog: number }
}

/** One system under test, on its own database. */
export interface System {
  name: string
  database: string
  /** The gateway's pid when the system has one. */
  gatewayPid?: number
  /** A worker process of its own (the Python SDK's), whose CPU counts with the bench process's. */
  workerPid?: number
  /** Empties the queue (not measured). */
  reset(): Promise<void>
  /** Queues `count` jobs in one statement and analyzes the table, as a backlog would look (not measured). */
  seed(count: number, prefix: string): Promise<void>
  /** The measured part: works `total` jobs; resolves to the number of refused steps. */
  work(r: Run, prefix: string): Promise<number>
  /** Proves every job ran exactly once; throws otherwise (not measured). */
  verify(total: number, prefix: string): Promise<void>
}

export function storeSteps(jobs: JobStore, types: JobType[]): FencegateSteps {
  const holder = (workerId: string, job: { jobId: string; fence: string }) => ({ tenant: 'default', workerId, jobId: job.jobId, fence: job.fence })
  return {
    async claim(workerId, max) {
      const claimed = await jobs.claimJobs({ tenant: 'default', workerId, types, max })
      return claimed.filter((c) => c.state === 'running').map((c) => ({ jobId: c.job_id, fence: c.fence }))
    },
    complete: async (w, job) => (await jobs.complete(holder(w, job), { ok: true }, { requestId: 'bench', caller: null, path: 'bench' })).completed,
    start: async (key) => {
      await jobs.startJob({ tenant: 'default', type: jobTypeName, key, payload: { bench: true }, restart: false })
    },
  }
}

/** The job API over HTTP; `auth` gives each call its token (a worker's, or a producer's without one). */
export function httpSteps(pool: HttpPool, auth?: (worker?: string) => Promise<Record<string, string>>): FencegateSteps {
  const post = async (path: string, body: unknown, worker?: string) => {
    const headers = { 'content-type': 'application/json', ...(auth ? await auth(worker) : {}) }
    const res = await pool.request({ path: `/_fencegate/jobs${path}`, method: 'POST', headers, body: JSON.stringify(body) })
    const text = await res.body.text()
    return { status: res.statusCode, json: text ? JSON.parse(text) : undefined }
  }
  return {
    async claim(worker_id, max, wait) {
      const r = await post('/claim', { worker_id, types: [jobTypeName], ...(max > 1 ? { max } : {}), ...(wait ? { wait } : {}) }, worker_id)
      if (r.status === 204) return []
      if (r.status !== 200) throw new Error(`claim answered ${r.status}`)
      const jobs: { job_id: string; fence: string }[] = max > 1 ? r.json.jobs : [r.json]
      return jobs.map((j) => ({ jobId: j.job_id, fence: j.fence }))
    },
    complete: async (worker_id, job) => (await post(`/${job.jobId}/complete`, { worker_id, fence: job.fence, result: { ok: true } }, worker_id)).status === 200,
    start: async (key) => {
      const r = await post('', { type: jobTypeName, key, payload: { bench: true } })
      if (r.status !== 201) throw new Error(`start answered ${r.status}`)
    },
  }
}

/** A fencegate system: the same database for the store in this process and for the gateway. */
export function fencegateSystem(s: { name: string; database: string; db: Db; steps: FencegateSteps; batch: number; longPoll: boolean; gatewayPid?: number }): System {
  const { db } = s
  return {
    name: s.name,
    database: s.database,
    ...(s.gatewayPid ? { gatewayPid: s.gatewayPid } : {}),
    reset: async () => {
      await db.sql`TRUNCATE fg_jobs, fg_job_chunks`
    },
    async seed(count, prefix) {
      await db.sql`
        INSERT INTO fg_jobs (tenant, type, key, payload, state)
        SELECT 'default', ${jobTypeName}, ${prefix} || '.' || g, '{"bench":true}'::jsonb, 'queued' FROM generate_series(1, ${count}) AS g`
      await db.sql`ANALYZE fg_jobs`
    },
    async work(r, prefix) {
      const progress = new Progress(r.total, r.steady?.backlog ?? r.total)
      if (!r.steady) progress.reserved = progress.produced = r.total
      const workers = fencegateWorkers(s.steps, { concurrency: r.concurrency, batch: s.batch, prefix, progress, steady: r.steady !== undefined, longPoll: s.longPoll, signal: r.signal })
      if (r.steady) await producers(r.steady.producers, progress, (n) => s.steps.start(`${prefix}.${n}`), r.signal)
      return workers
    },
    async verify(total) {
      const [row] = await db.sql<{ succeeded: number; other: number; again: number }>`
        SELECT count(*) FILTER (WHERE state = 'succeeded')::int AS succeeded, count(*) FILTER (WHERE state <> 'succeeded')::int AS other,
               count(*) FILTER (WHERE attempt <> 1 OR fence <> 1)::int AS again
        FROM fg_jobs`
      if (row!.succeeded !== total || row!.other !== 0 || row!.again !== 0) throw new Error(`${s.name}: expected ${total} jobs succeeded once each, found ${JSON.stringify(row)}`)
    },
  }
}

const silent = new Logger(() => () => {})

/**
 * graphile-worker 0.17 with its defaults, `concurrency` jobs at a time, on a warm pool of
 * as many connections as fencegate's store gets. The phase ends when every task has run
 * and the queue table is empty (its completions committed), and includes the runner's
 * start and stop (a few statements on the warm pool).
 */
export async function graphileSystem(s: { url: string; database: string; connections: number }): Promise<System & { close(): Promise<void> }> {
  const pool = new pg.Pool({ connectionString: s.url, max: s.connections })
  const producerPool = new pg.Pool({ connectionString: s.url, max: s.connections })
  for (const p of [pool, producerPool]) {
    const report = (err: Error) => console.error(`graphile-worker pool: ${err.message}`)
    p.on('error', report)
    p.on('connect', (client) => client.on('error', report))
  }
  await runMigrations({ pgPool: pool, logger: silent })
  const utils: WorkerUtils = await makeWorkerUtils({ pgPool: producerPool, logger: silent })
  const warm = async (p: pg.Pool, n: number) => {
    const clients = await Promise.all(Array.from({ length: n }, () => p.connect()))
    clients.forEach((c) => c.release())
  }
  await warm(pool, s.connections)
  await warm(producerPool, s.connections)
  const ran = new Set<string>()
  let repeated = 0
  return {
    name: 'graphile-worker 0.17',
    database: s.database,
    reset: async () => {
      await pool.query('TRUNCATE graphile_worker._private_jobs')
      ran.clear()
      repeated = 0
    },
    async seed(count, prefix) {
      for (let from = 0; from < count; from += 10_000) {
        const specs = Array.from({ length: Math.min(10_000, count - from) }, (_, i) => ({ identifier: jobTypeName, payload: { bench: true, key: `${prefix}.${from + i}` } }))
        await utils.addJobs(specs)
      }
      await pool.query('ANALYZE graphile_worker._private_jobs')
    },
    async work(r, prefix) {
      const progress = new Progress(r.total, r.steady?.backlog ?? r.total)
      let finish: () => void = () => {}
      const finished = new Promise<void>((resolve) => (finish = resolve))
      const runner = await run({
        pgPool: pool, concurrency: r.concurrency, noHandleSignals: true, logger: silent,
        taskList: {
          [jobTypeName]: async (_payload, helpers) => {
            if (ran.has(helpers.job.id)) repeated++
            ran.add(helpers.job.id)
            progress.done()
            if (progress.completed >= r.total) finish()
          },
        },
      })
      const abort = () => finish()
      r.signal.addEventListener('abort', abort)
      try {
        if (r.steady) await producers(r.steady.producers, progress, (n) => utils.addJob(jobTypeName, { bench: true, key: `${prefix}.${n}` }).then(() => {}), r.signal)
        await finished
        // A job is done when its completion has committed (graphile deletes it), not when its task returned.
        while (!r.signal.aborted && (await pool.query<{ left: boolean }>('SELECT EXISTS (SELECT 1 FROM graphile_worker._private_jobs) AS left')).rows[0]!.left) {
          await new Promise((resolve) => setTimeout(resolve, 1))
        }
      } finally {
        r.signal.removeEventListener('abort', abort)
        await runner.stop()
      }
      return 0
    },
    async verify(total) {
      const { rows } = await pool.query<{ left: number }>('SELECT count(*)::int AS left FROM graphile_worker._private_jobs')
      if (ran.size !== total || repeated !== 0 || rows[0]!.left !== 0) throw new Error(`graphile-worker: expected ${total} jobs run once each and none left, found ${ran.size} run, ${repeated} repeated, ${rows[0]!.left} left`)
    },
    async close() {
      await utils.release()
      await producerPool.end()
      await pool.end()
    },
  }
}
