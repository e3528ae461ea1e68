import type { Case } from './cases.js'
import { runLoad, type LoadGenerator, type LoadResult } from './load.js'
import { cpuBetween, cpuSeconds, machineCpu, postgresCpu } from './procs.js'
import { connectionsTo, treeCpuSeconds } from './proc-tree.js'
import type { BenchStore } from './fresh-db.js'
import type { Systems } from './systems.js'
import type { Traffic } from './traffic.js'

/** One measured run of one case. */
export interface Sample {
  round: number
  load: LoadResult
  /** CPU seconds over the run. */
  cpu: {
    /** The process answering the load generator: nginx, the bare proxy, the hand-rolled fence or the gateway. */
    proxy: number
    upstream: number
    /** This run's PostgreSQL backends and the server's background processes. */
    postgres: number
    /** Every process named postgres on the machine (other databases' backends too). */
    postgresAll: number
    load: number
    /** The whole machine's busy CPU, in cores. */
    machineBusy: number
  }
  /** PostgreSQL connections the system's processes held when the run ended. */
  connections: number
}

export interface RunSpec {
  kind: LoadGenerator
  connections: number
  seconds: number
  dir: string
  signal: AbortSignal
}

/** Reads every CPU counter, runs the load, reads them again. */
export async function measure(c: Case, round: number, systems: Systems, store: BenchStore, traffic: Traffic, spec: RunSpec): Promise<Sample> {
  const target = systems.running[c.system]!
  const pids = await store.pids()
  // The proxy is a process tree: the gateway with --workers is a supervisor and its workers.
  const upstreamPid = (c.upstream ? systems.running[c.upstream]!.child : systems.upstream).pid
  const read = () => ({ proxy: treeCpuSeconds(target.child.pid), upstream: cpuSeconds(upstreamPid), pg: postgresCpu(pids), pgAll: postgresCpu(), machine: machineCpu() })
  const before = read()
  const load = await runLoad(spec.kind, { url: target.url, connections: spec.connections, seconds: spec.seconds, traffic, dir: spec.dir, signal: spec.signal })
  const after = read()
  return {
    round,
    load,
    connections: connectionsTo(target.child.pid, store.port),
    cpu: {
      proxy: after.proxy - before.proxy,
      upstream: after.upstream - before.upstream,
      postgres: cpuBetween(before.pg, after.pg),
      postgresAll: cpuBetween(before.pgAll, after.pgAll),
      load: load.cpuSeconds,
      machineBusy: (after.machine.busy - before.machine.busy) / Math.max(1e-9, load.seconds),
    },
  }
}

/** Discarded load, so every pool is open and every code path compiled before a run counts. */
export async function warmUp(c: Case, systems: Systems, traffic: Traffic, spec: RunSpec): Promise<LoadResult> {
  const target = systems.running[c.system]!
  return runLoad(spec.kind, { url: target.url, connections: spec.connections, seconds: spec.seconds, traffic, dir: spec.dir, signal: spec.signal })
}
