/**
 * A complete worker for `customer_health_report` jobs, run by the test suite
 * (test/client.test.ts) against a real gateway and upstream.
 *
 * Each job fetches an account's usage from the CRM through the gateway, scores
 * it in a worker thread (CPU work off the event loop, so heartbeats keep
 * running), records its progress and publishes the report through the gateway.
 * Both side effects go through `fence: lease` routes with the SDK's fence and
 * idempotency key, so a successor that redoes a step gets the stored answer.
 *
 * Run it after `npm run build`:
 *   FENCEGATE_URL=http://127.0.0.1:8080 node dist/examples/report-worker.js
 */
import { pathToFileURL } from 'node:url'
import { Worker } from 'node:worker_threads'
// In your own project: import { FencegateClient, type WorkEvent } from 'fencegate/client'
import { FencegateClient, type WorkEvent } from '../src/client/index.js'

export interface ReportWorkerOptions {
  /** The gateway's data plane: the job API and the fenced routes. */
  baseUrl: string
  token?: string
  /** Abort to shut down: no new claims, in-flight reports get `shutdownGraceMs` to finish. */
  signal: AbortSignal
  concurrency?: number
  shutdownGraceMs?: number
  onEvent?: (event: WorkEvent) => void
}

// Plain JavaScript, so the thread needs no TypeScript loader. Deliberately heavy: this is what must not run on the event loop.
const scoringThread = `
const { parentPort, workerData } = require('node:worker_threads')
let total = 0
for (const usage of workerData) for (let i = 1; i <= 200000; i++) total += Math.sqrt(usage * i) / i
parentPort.postMessage(Math.round(total) / workerData.length)
`

/**
 * Scores usage in a worker thread. When the lease ends (`signal` aborts), the
 * thread is terminated: a lost job stops using the CPU, and nothing it computed is used.
 *
 * @example
 * const score = await scoreInThread([3, 5, 8], lease.signal)
 */
export function scoreInThread(usage: number[], signal: AbortSignal): Promise<number> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason)
    const thread = new Worker(scoringThread, { eval: true, workerData: usage })
    const stop = () => {
      void thread.terminate()
      reject(signal.reason)
    }
    signal.addEventListener('abort', stop, { once: true })
    thread.once('message', (score: number) => {
      signal.removeEventListener('abort', stop)
      void thread.terminate()
      resolve(score)
    })
    thread.once('error', (err) => {
      signal.removeEventListener('abort', stop)
      reject(err)
    })
  })
}

/**
 * Runs the report worker until `signal` aborts.
 *
 * @example
 * const stop = new AbortController()
 * await main({ baseUrl: 'http://127.0.0.1:8080', signal: stop.signal })
 */
export async function main(options: ReportWorkerOptions): Promise<void> {
  const client = new FencegateClient({ baseUrl: options.baseUrl, ...(options.token ? { token: options.token } : {}) })
  const gateway = options.baseUrl.replace(/\/+$/, '')
  await client.work({
    types: ['customer_health_report'],
    concurrency: options.concurrency ?? 4,
    signal: options.signal,
    shutdownGraceMs: options.shutdownGraceMs ?? 10_000,
    ...(options.onEvent ? { onEvent: options.onEvent } : {}),
  }, async (job, lease) => {
    const { account } = job.payload as { account: string }
    const account_ = encodeURIComponent(account)
    const crm = await lease.step('fetch-data', () => lease.fetch(`${gateway}/crm/accounts/${account_}/usage`, { method: 'POST' }))
    if (!crm.ok) throw new Error(`the CRM answered ${crm.status}`)
    const { usage } = (await crm.json()) as { usage: number[] }
    const score = await scoreInThread(usage, lease.signal)
    // A successor continues the output where its predecessor stopped.
    if (lease.cursor === 0) await lease.append({ step: 'scored', score })
    const published = await lease.step('publish', () => lease.fetch(`${gateway}/reports/${account_}`, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ account, score }),
    }))
    if (!published.ok) throw new Error(`publishing answered ${published.status}`)
    return { account, score }
  })
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const stop = new AbortController()
  for (const signal of ['SIGINT', 'SIGTERM'] as const) process.once(signal, () => stop.abort())
  await main({
    baseUrl: process.env.FENCEGATE_URL ?? 'http://127.0.0.1:8080',
    ...(process.env.FENCEGATE_TOKEN ? { token: process.env.FENCEGATE_TOKEN } : {}),
    signal: stop.signal,
    onEvent: (e) => console.log(JSON.stringify(e)),
  })
}
