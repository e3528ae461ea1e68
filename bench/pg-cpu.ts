import postgres from 'postgres'
import { cpuSeconds } from './procs.js'

/**
 * CPU of the PostgreSQL backends serving one database, read from /proc/<pid>/stat for
 * the pids pg_stat_activity lists for it. On a machine shared with other databases this
 * counts only this bench's load (the server's background writers are left out).
 */
export interface BackendCpu {
  /** CPU seconds so far of each backend of `database`, by pid. */
  snapshot(database: string): Promise<Map<number, number>>
  close(): Promise<void>
}

/** Watches from `adminUrl`'s database, so the watcher is not one of the backends it counts. */
export function backendCpu(adminUrl: string): BackendCpu {
  const admin = postgres(adminUrl, { max: 1, connect_timeout: 5, onnotice: () => {} })
  return {
    async snapshot(database) {
      const rows = await admin<{ pid: number }[]>`SELECT pid FROM pg_stat_activity WHERE datname = ${database} AND pid <> pg_backend_pid()`
      return new Map(rows.map((r) => [r.pid, cpuSeconds(r.pid)]))
    },
    close: () => admin.end({ timeout: 5 }),
  }
}

/** CPU seconds between two snapshots: a backend born in between counts from zero; one gone in between is lost (rare: pools stay warm). */
export function backendCpuBetween(before: Map<number, number>, after: Map<number, number>): number {
  let total = 0
  for (const [pid, s] of after) total += s - (before.get(pid) ?? 0)
  return total
}
