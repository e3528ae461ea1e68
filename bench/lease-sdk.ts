// The worker SDKs in `npm run bench -- leases` (issue 44): `work()` of the TS SDK
// (fencegate/client, in the bench process) and of the Python client (clients/python, a python3
// process per row, bench/python-worker.py), threads and asyncio, each at every `--slots`,
// no-op handlers against the same gateway as `http`. What the SDK adds over the bare
// calls of `http` (claim → complete) is its work loop, leases and heartbeat timers; the
// Python rows put a Python worker's jobs/s beside the TS SDK's.
import { setMaxListeners } from 'node:events'
import { existsSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { createInterface } from 'node:readline'
import { FencegateClient, type WorkEvent } from '../src/client/index.js'
import { baselineRatios, type MeasuredPhase } from './lease-baseline.js'
import type { SystemName } from './lease-options.js'
import type { System } from './lease-systems.js'
import { producers, Progress } from './lease-workload.js'
import { startProcess, stopChild } from './procs.js'

export const sdkSystems = ['sdk', 'py-sdk', 'py-sdk-async'] as const
export type SdkSystem = (typeof sdkSystems)[number]

export const python = '/usr/bin/python3'
// The checkout's root from dist/bench/ (the bench) or bench/ (its test, from source).
const root = fileURLToPath(new URL(import.meta.url.includes('/dist/bench/') ? '../../' : '../', import.meta.url))
const labels: Record<SdkSystem, string> = { sdk: 'TS SDK work()', 'py-sdk': 'Python SDK work(), threads', 'py-sdk-async': 'Python SDK work(), asyncio' }
/** How long an idle claim of the SDK rows waits on the server: stopping a worker waits for it. */
const claimWait = 1

/**
 * The row of one SDK at `slots` jobs at once.
 *
 * @example
 * sdkCaseName('py-sdk', 8) // 'Python SDK work(), threads, 8 slots'
 */
export function sdkCaseName(system: SdkSystem, slots: number): string {
  return `${labels[system]}, ${slots} slot${slots === 1 ? '' : 's'}`
}

export const isSdkSystem = (name: SystemName): name is SdkSystem => (sdkSystems as readonly string[]).includes(name)

/**
 * The Python rows paired with the TS SDK's row of the same slots, for the ratio lines; none
 * without the TS SDK's rows.
 *
 * @example
 * sdkPairs(['sdk', 'py-sdk'], [1, 8]) // [['Python SDK work(), threads, 1 slot', 'TS SDK work(), 1 slot'], [… 8 slots …]]
 */
export function sdkPairs(systems: readonly SystemName[], slots: readonly number[]): [string, string][] {
  if (!systems.includes('sdk')) return []
  return slots.flatMap((n) => systems.filter((s): s is SdkSystem => s === 'py-sdk' || s === 'py-sdk-async').map((s): [string, string] => [sdkCaseName(s, n), sdkCaseName('sdk', n)]))
}

/** Each Python row's jobs/s over the TS SDK's at the same slots: the ratio within each round, the median over rounds. */
export function sdkRatioLines(phases: MeasuredPhase[], pairs: [string, string][]): string[] {
  return baselineRatios(phases, pairs).map((r) => `  ${r.regime}, ${r.current}: ${(100 * r.jobsPerSecond).toFixed(0)}% of the TS SDK's jobs/s (${r.rounds} round(s))`)
}

/** One SDK worker, kept across phases. */
export interface SdkWorker {
  /** The process whose CPU is the worker's, when it is not the bench's own. */
  pid?: number
  /** Works until `total` jobs had an outcome, calling `completed` for each completion; resolves to the jobs not completed. */
  run(total: number, completed: () => void, signal: AbortSignal): Promise<number>
  /** Resolves once the worker has stopped claiming after its last run (not measured). */
  idle(): Promise<void>
  close(): Promise<void>
}

const outcomes = new Set<WorkEvent['type']>(['completed', 'failed', 'lost', 'cancelled', 'released', 'error'])

/** `FencegateClient.work()` in this process, with the global fetch (undici's keep-alive pool). */
export function tsSdkWorker(baseUrl: string, slots: number, type: string): SdkWorker {
  const client = new FencegateClient({ baseUrl, workerId: `bench-sdk-${slots}` })
  let stopped: Promise<unknown> = Promise.resolve()
  return {
    run: (total, completed, signal) => new Promise<number>((resolve, reject) => {
      const controller = new AbortController()
      // work() listens on its signal once per running job (each one's shutdown grace): Node warns past 10.
      setMaxListeners(slots + 10, controller.signal)
      let [done, refused] = [0, 0]
      const finish = () => {
        signal.removeEventListener('abort', finish)
        controller.abort()
        resolve(refused)
      }
      signal.addEventListener('abort', finish, { once: true })
      const onEvent = (e: WorkEvent) => {
        if (!outcomes.has(e.type)) return
        if (e.type === 'completed') completed()
        else refused++
        // A claim's error has no job: it counts as refused, but no job is done with it.
        if ('jobId' in e && e.jobId !== undefined && ++done === total) finish()
      }
      stopped = client.work({ types: [type], concurrency: slots, signal: controller.signal, claimWait, onEvent }, () => ({ ok: true }))
        .catch((err: unknown) => reject(err as Error))
    }),
    idle: async () => void (await stopped),
    close: async () => void (await stopped),
  }
}

/** bench/python-worker.py in a python3 process, the client from clients/python/src. */
export async function pythonWorker(baseUrl: string, mode: 'sync' | 'async', slots: number, type: string): Promise<SdkWorker> {
  if (!existsSync(python)) throw new Error(`the py-sdk rows need ${python}; leave them out of --systems without it`)
  const env = { ...process.env, PYTHONPATH: join(root, 'clients', 'python', 'src'), PYTHONDONTWRITEBYTECODE: '1' }
  const args = [join(root, 'bench', 'python-worker.py'), baseUrl, mode, String(slots), type, `bench-py-${mode}-${slots}`, String(claimWait)]
  const child = startProcess(`python worker (${mode}, ${slots} slots)`, python, args, env)
  const exited = child.exited.then((code): never => {
    throw new Error(`${child.name} exited (${code}):\n${child.output()}`)
  })
  exited.catch(() => {})
  let ready!: () => void
  let idle: (() => void) | undefined
  let phase: (line: string) => void = () => {}
  createInterface({ input: child.process.stdout! }).on('line', (line) => {
    if (line === 'ready') ready()
    else if (line.startsWith('idle ')) idle?.()
    else phase(line)
  })
  await Promise.race([new Promise<void>((r) => (ready = r)), exited])
  let stopped: Promise<unknown> = Promise.resolve()
  return {
    pid: child.pid,
    run: (total, completed, signal) => new Promise<number>((resolve, reject) => {
      let [done, refused] = [0, 0]
      const finish = () => {
        signal.removeEventListener('abort', finish)
        resolve(refused)
      }
      signal.addEventListener('abort', finish, { once: true })
      stopped = Promise.race([new Promise<void>((r) => (idle = r)), exited])
      stopped.catch(reject)
      phase = (line) => {
        // `completed` and `refused …` are jobs; `problem …` a claim that failed (no job done with it).
        if (line === 'completed') completed()
        else refused++
        if (!line.startsWith('problem ') && ++done === total) finish()
      }
      child.process.stdin!.write(`run ${total}\n`)
    }),
    idle: async () => void (await stopped),
    async close() {
      child.process.stdin!.end()
      await Promise.race([child.exited, new Promise((r) => setTimeout(r, 10_000))])
      await stopChild(child)
    },
  }
}

/**
 * An SDK row: the queue, seeding and checks of `fencegate` (the same database as `http`), with
 * the SDK's `work()` as the worker; producers, when steady, start jobs through `start`.
 */
export function sdkSystem(name: string, base: System, worker: SdkWorker, start: (key: string) => Promise<void>): System {
  return {
    ...base,
    name,
    ...(worker.pid ? { workerPid: worker.pid } : {}),
    async work(r, prefix) {
      const progress = new Progress(r.total, r.steady?.backlog ?? r.total)
      if (!r.steady) progress.reserved = progress.produced = r.total
      const worked = worker.run(r.total, () => progress.done(), r.signal)
      if (r.steady) await producers(r.steady.producers, progress, (n) => start(`${prefix}.${n}`), r.signal)
      return worked
    },
    async verify(total, prefix) {
      await worker.idle()
      await base.verify(total, prefix)
    },
  }
}
