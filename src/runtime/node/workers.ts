import { readFileSync } from 'node:fs'
import { availableParallelism } from 'node:os'
import { ConfigError } from '../../config/schema.js'

/**
 * How many worker processes `server.workers` (or `--workers`) asks for, and what each may
 * take of the store's connections. A process model is a runtime concern: this is Node's.
 */

/**
 * The CPUs a cgroup v2 `cpu.max` allows (`"150000 100000"` is 1.5: rounded up), or undefined
 * without a limit (`"max 100000"`) or without the file.
 *
 * @example cgroupCpus('200000 100000') // 2
 */
export function cgroupCpus(cpuMax: string | undefined): number | undefined {
  const [quota, period] = (cpuMax ?? '').trim().split(/\s+/)
  if (!quota || quota === 'max' || !period) return undefined
  const cpus = Number(quota) / Number(period)
  return Number.isFinite(cpus) && cpus > 0 ? Math.ceil(cpus) : undefined
}

/** Where cgroup v2 puts the CPU limit of the cgroup a container's processes see as their root. */
export const cgroupCpuMaxPath = '/sys/fs/cgroup/cpu.max'

/**
 * The text of a cgroup v2 `cpu.max`, or undefined when it cannot be read (cgroup v1, no
 * cgroup filesystem, another OS): then there is no limit to honour.
 *
 * @example readCpuMax() // 'max 100000\n' without a limit
 */
export function readCpuMax(path: string = cgroupCpuMaxPath): string | undefined {
  try {
    return readFileSync(path, 'utf8')
  } catch {
    return undefined
  }
}

/** What `auto` reads of the host; a parameter so a test can stand in for the machine it runs on. */
export interface CpuHost {
  /** The `cpu.max` text, or undefined without one. */
  cpuMax(): string | undefined
  /** The CPUs this process may run on (its affinity). */
  cpus(): number
}

const thisHost: CpuHost = { cpuMax: () => readCpuMax(), cpus: availableParallelism }

/**
 * The number of workers: the setting, or for `auto` the CPUs this process may use (its
 * affinity, as `os.availableParallelism()` reads it, capped by a cgroup CPU limit: a
 * container limited to 2 CPUs on a 32-core host gets 2).
 *
 * @example workerCount('auto') // 2 on a 2-CPU container
 */
export function workerCount(setting: number | 'auto', host: CpuHost = thisHost): number {
  if (setting !== 'auto') return setting
  const limit = cgroupCpus(host.cpuMax())
  return Math.max(1, Math.min(host.cpus(), limit ?? Infinity))
}

/**
 * Each worker's statement pool when `workers` share `store.max_connections`: every worker
 * also keeps one LISTEN connection (rules and job wake-ups), so a worker gets
 * `floor(max_connections / workers) - 1` for statements, and the total never exceeds
 * `max_connections`. Fails at start when that leaves a worker no statement connection.
 *
 * @example workerPool(20, 4) // 4: 4 × (4 + 1) = 20 connections
 */
export function workerPool(maxConnections: number, workers: number): number {
  const pool = Math.floor(maxConnections / workers) - 1
  if (pool < 1) {
    throw new ConfigError([`server.workers: ${workers} workers need store.max_connections of at least ${2 * workers} (each a statement connection and a LISTEN connection); it is ${maxConnections}`])
  }
  return pool
}
