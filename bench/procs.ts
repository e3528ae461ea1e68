import { spawn, type ChildProcess } from 'node:child_process'
import { createWriteStream, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { fileURLToPath } from 'node:url'

/** A child process whose output is kept (the tail only) to explain a failure. */
export interface Child {
  name: string
  process: ChildProcess
  pid: number
  output(): string
  exited: Promise<number | null>
}

const keepChars = 4000

/** Runs `node [nodeArgs] script [args]` with this bench's own node binary; `logFile` gets all its output. */
export function startChild(name: string, script: URL, args: string[], env: NodeJS.ProcessEnv, nodeArgs: string[] = [], logFile?: string): Child {
  return startProcess(name, process.execPath, [...nodeArgs, fileURLToPath(script), ...args], env, logFile)
}

/** Runs `command args`, keeping the tail of its output. */
export function startProcess(name: string, command: string, args: string[], env: NodeJS.ProcessEnv, logFile?: string): Child {
  const child = spawn(command, args, { env, stdio: ['pipe', 'pipe', 'pipe'] })
  let tail = ''
  const log = logFile ? createWriteStream(logFile, { flags: 'a' }) : undefined
  if (log) child.once('exit', () => log.end())
  const keep = (chunk: Buffer) => {
    tail = (tail + chunk.toString('utf8')).slice(-keepChars)
    log?.write(chunk)
  }
  child.stdout!.on('data', keep)
  child.stderr!.on('data', keep)
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
  if (child.pid === undefined) throw new Error(`could not start ${name}`)
  return { name, process: child, pid: child.pid, output: () => tail, exited }
}

/** SIGTERM, then SIGKILL if the child has not exited within `graceMs`. */
export async function stopChild(child: Child, graceMs = 15_000): Promise<void> {
  if (child.process.exitCode !== null || child.process.signalCode !== null) return
  child.process.kill('SIGTERM')
  let timer: NodeJS.Timeout | undefined
  const killed = new Promise<void>((resolve) => {
    timer = setTimeout(() => {
      child.process.kill('SIGKILL')
      resolve()
    }, graceMs)
  })
  await Promise.race([child.exited.then(() => undefined), killed])
  clearTimeout(timer)
  await child.exited
}

/** A loopback port that was free a moment ago (bound to 0, then released). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const address = server.address()
      const port = typeof address === 'object' && address ? address.port : 0
      server.close(() => resolve(port))
    })
  })
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** Polls until `probe` resolves true, the child dies or `timeoutMs` passes. */
export async function waitUntil(child: Child, what: string, probe: () => Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    if (child.process.exitCode !== null) throw new Error(`${child.name} exited (${child.process.exitCode}) before ${what}:\n${child.output()}`)
    if (await probe().catch(() => false)) return
    await sleep(100)
  }
  throw new Error(`${child.name} was not ${what} after ${timeoutMs} ms:\n${child.output()}`)
}

export async function isHealthy(url: string): Promise<boolean> {
  const res = await fetch(url, { signal: AbortSignal.timeout(2000) })
  await res.arrayBuffer()
  return res.status === 200
}

/** The name bench/leases.ts and older code know `listeningPort` by. */
export const upstreamPort = (child: Child, timeoutMs?: number) => listeningPort(child, timeoutMs)

/** A server child of the bench (bench/child.ts) prints its port as the first line on stdout. */
export async function listeningPort(child: Child, timeoutMs = 10_000): Promise<number> {
  let port = 0
  await waitUntil(child, 'listening', async () => {
    const m = /"port":(\d+)/.exec(child.output())
    if (m) port = Number(m[1])
    return port > 0
  }, timeoutMs)
  return port
}

/** A memory figure in KiB from /proc/<pid>/status (VmHWM: peak RSS, VmRSS: now), or undefined off Linux. */
export function memoryKiB(pid: number, field: 'VmHWM' | 'VmRSS'): number | undefined {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
    return m ? Number(m[1]) : undefined
  } catch {
    return undefined
  }
}

/**
 * Resets a process's peak RSS (VmHWM) to its current RSS, so the next VmHWM read is
 * the peak since now (Linux >= 4.0, `echo 5 > /proc/<pid>/clear_refs`). False when
 * that is not possible: VmHWM then stays the peak since the process started.
 */
export function resetPeakRss(pid: number): boolean {
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, '5')
    return true
  } catch {
    return false
  }
}

// USER_HZ is 100 on every Linux architecture Node supports.
const ticksPerSecond = 100

/** CPU seconds (user + system) a process has used so far; 0 when /proc is unavailable. */
export function cpuSeconds(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    // Fields after the parenthesised command name, which may itself contain spaces.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
    return (Number(fields[11]) + Number(fields[12])) / ticksPerSecond
  } catch {
    return 0
  }
}

/** Machine-wide busy and total CPU seconds so far (all cores), from /proc/stat. */
export function machineCpu(): { busy: number; total: number } {
  try {
    const line = readFileSync('/proc/stat', 'utf8').split('\n')[0]!
    const v = line.trim().split(/\s+/).slice(1).map(Number)
    const total = v.reduce((a, b) => a + b, 0)
    const idle = (v[3] ?? 0) + (v[4] ?? 0)
    return { busy: (total - idle) / ticksPerSecond, total: total / ticksPerSecond }
  } catch {
    return { busy: 0, total: 0 }
  }
}

/**
 * CPU seconds so far of every process whose command is `postgres` (the server and its
 * backends), or of those in `only`, by pid; a window's usage is the sum of the differences over pids seen at both ends.
 */
export function postgresCpu(only?: ReadonlySet<number>): Map<number, number> {
  const seen = new Map<number, number>()
  let pids: string[]
  try {
    pids = readdirSync('/proc').filter((d) => /^\d+$/.test(d))
  } catch {
    return seen
  }
  for (const pid of pids) {
    if (only && !only.has(Number(pid))) continue
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
      if (stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')')) !== 'postgres') continue
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
      seen.set(Number(pid), (Number(fields[11]) + Number(fields[12])) / ticksPerSecond)
    } catch {
      // gone meanwhile
    }
  }
  return seen
}

export function cpuBetween(before: Map<number, number>, after: Map<number, number>): number {
  let total = 0
  for (const [pid, s] of after) {
    const b = before.get(pid)
    if (b !== undefined) total += s - b
  }
  return total
}
