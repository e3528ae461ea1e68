// A system that is several processes (the gateway with `--workers N`: a supervisor and its
// cluster workers) is measured as all of them: CPU summed over the tree, and the PostgreSQL
// connections its processes hold, read from /proc (Linux only; 0 elsewhere).
import { readFileSync, readdirSync, readlinkSync } from 'node:fs'
import { cpuSeconds } from './procs.js'

function parentOf(pid: string): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
  } catch {
    return undefined
  }
}

/** `pid` and every process below it. */
export function processTree(pid: number): number[] {
  let all: string[]
  try {
    all = readdirSync('/proc').filter((d) => /^\d+$/.test(d))
  } catch {
    return [pid]
  }
  const parents = new Map(all.map((p) => [Number(p), parentOf(p)]))
  const tree = [pid]
  for (let i = 0; i < tree.length; i++) {
    for (const [child, parent] of parents) if (parent === tree[i]) tree.push(child)
  }
  return tree
}

/**
 * CPU seconds of a process tree so far. A worker that died within a window takes its CPU
 * with it, so the bench treats a death in a run as a failed run (bench/main.ts).
 */
export function treeCpuSeconds(pid: number): number {
  return processTree(pid).reduce((sum, p) => sum + cpuSeconds(p), 0)
}

function socketInodes(pid: number): Set<string> {
  const inodes = new Set<string>()
  let fds: string[]
  try {
    fds = readdirSync(`/proc/${pid}/fd`)
  } catch {
    return inodes
  }
  for (const fd of fds) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))
      if (m) inodes.add(m[1]!)
    } catch {
      // closed meanwhile
    }
  }
  return inodes
}

/** Established TCP connections to `port` held by the process tree under `pid`. */
export function connectionsTo(pid: number, port: number): number {
  const inodes = new Set(processTree(pid).flatMap((p) => [...socketInodes(p)]))
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0')
  let n = 0
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let lines: string[]
    try {
      lines = readFileSync(table, 'utf8').split('\n').slice(1)
    } catch {
      continue
    }
    for (const line of lines) {
      const f = line.trim().split(/\s+/)
      // f[2]: remote address:port, f[3]: state (01 = ESTABLISHED), f[9]: inode
      if (f.length > 9 && f[3] === '01' && f[2]!.endsWith(`:${hexPort}`) && inodes.has(f[9]!)) n++
    }
  }
  return n
}
