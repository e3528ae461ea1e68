import { execFileSync, spawnSync } from 'node:child_process'
import { spawn, type ChildProcess } from 'node:child_process'
import { chmodSync, existsSync, mkdtempSync, readdirSync, realpathSync, rmSync, writeFileSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'

/**
 * A throwaway PostgreSQL cluster of a fault test's own: `initdb` into a temporary
 * directory, `pg_ctl` on a free loopback port. The test stops, kills and restarts it as it
 * pleases; the shared server at DATABASE_URL is never touched.
 */
export interface Cluster {
  url: string
  port: number
  /** The directory holding `data` (the data directory) and `log`. */
  dir: string
  /** The server's log; each line starts with its SQLSTATE (`log_line_prefix = '%e '`). */
  log: string
  /** `pg_ctl stop` with the given mode (`immediate` is a crash: no checkpoint, clients cut). */
  stop(mode?: 'fast' | 'immediate'): void
  start(): void
  /** Terminates every backend whose application_name is `app`; resolves to how many. */
  terminate(app: string): Promise<number>
  destroy(): void
}

/** What the fault and failover tests run: a cluster's own server, and the tools that copy, promote and rewind it. */
const serverTools = ['initdb', 'pg_ctl', 'postgres', 'pg_basebackup', 'pg_rewind']

/**
 * The directory holding PostgreSQL's server tools, or undefined (with a warning naming what is
 * missing, so a skipped suite says why) when any of them is not installed.
 */
export function postgresBinaries(): string | undefined {
  const dir = serverToolsDir()
  const missing = serverTools.filter((tool) => !dir || !existsSync(join(dir, tool)))
  if (missing.length === 0) return dir
  console.warn(`PostgreSQL cluster tests skipped: ${missing.join(', ')} not found (Debian: apt-get install postgresql)`)
  return undefined
}

function serverToolsDir(): string | undefined {
  const onPath = spawnSync('sh', ['-c', 'command -v initdb'], { encoding: 'utf8' }).stdout.trim()
  // A link on PATH (Debian's /usr/local/bin/initdb) points into the directory with all the tools.
  if (onPath) return join(realpathSync(onPath), '..')
  const base = '/usr/lib/postgresql'
  if (!existsSync(base)) return undefined
  const version = readdirSync(base).sort((a, b) => Number(b) - Number(a))[0]
  return version && join(base, version, 'bin')
}

// PostgreSQL refuses to run as root; as root the cluster belongs to the `postgres` user.
const asRoot = process.getuid?.() === 0

/** The command line that runs `bin` as the `postgres` user when this process is root. */
export function asPostgres(bin: string, args: string[]): [string, string[]] {
  return asRoot ? ['runuser', ['-u', 'postgres', '--', bin, ...args]] : [bin, args]
}

// No pipes: the server that `pg_ctl start` leaves running would hold them open, and the
// call would wait for it to exit. Its output goes to the cluster's log file instead.
export function run(bin: string, args: string[]): void {
  const [cmd, argv] = asPostgres(bin, args)
  execFileSync(cmd, argv, { stdio: 'ignore' })
}

/**
 * `run` without blocking the event loop: for a measurement whose own clock (HTTP answers,
 * arrivals at an upstream) must keep ticking while `pg_ctl` waits.
 */
export function runAsync(bin: string, args: string[]): Promise<void> {
  const [cmd, argv] = asPostgres(bin, args)
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, argv, { stdio: 'ignore' })
    child.once('error', reject)
    child.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`${bin} exited with ${code}`))))
  })
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer()
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number }
      server.close(() => resolve(port))
    })
  })
}

/** Creates and starts a cluster; durable commits, as in production. `maxConnections` is the server's `max_connections` (100). */
export async function startCluster(bin: string, options: { maxConnections?: number; port?: number; settings?: string[]; checksums?: boolean } = {}): Promise<Cluster> {
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-cluster-'))
  chmodSync(dir, 0o777)
  const data = join(dir, 'data')
  run(join(bin, 'initdb'), ['-D', data, '-U', 'postgres', '--auth=trust', '-E', 'UTF8', '--no-instructions', ...(options.checksums ? ['--data-checksums'] : [])])
  return clusterIn(bin, dir, options.port ?? await freePort(), [`max_connections=${options.maxConnections ?? 100}`, ...(options.settings ?? [])])
}

/**
 * Starts the cluster whose data directory is `dir/data` (made by initdb or pg_basebackup) on
 * `port`, with `settings` (`name=value`) on its command line.
 */
export function clusterIn(bin: string, dir: string, port: number, settings: string[] = []): Cluster {
  const data = join(dir, 'data')
  const opts = [`-p ${port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=on -c log_line_prefix='%e '`, ...settings.map((s) => `-c ${s}`)].join(' ')
  const start = () => run(join(bin, 'pg_ctl'), ['-D', data, '-o', opts, '-l', join(dir, 'log'), '-w', '-t', '30', 'start'])
  start()
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`
  return {
    url,
    port,
    dir,
    log: join(dir, 'log'),
    stop: (mode = 'fast') => run(join(bin, 'pg_ctl'), ['-D', data, '-m', mode, '-w', 'stop']),
    start,
    async terminate(app) {
      const admin = postgres(url, { max: 1, onnotice: () => {}, fetch_types: false, connection: { application_name: 'fault-test' } })
      try {
        const rows = await admin<{ pid: number }[]>`
          SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = ${app} AND pid <> pg_backend_pid()`
        return rows.length
      } finally {
        await admin.end({ timeout: 1 })
      }
    },
    destroy() {
      try {
        run(join(bin, 'pg_ctl'), ['-D', data, '-m', 'immediate', '-w', 'stop'])
      } catch {
        // Already stopped.
      }
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

/** The PgBouncer binary (Debian's `pgbouncer`), or undefined when it is not installed. */
export function pgbouncerBinary(): string | undefined {
  const found = spawnSync('sh', ['-c', 'command -v pgbouncer || ls /usr/sbin/pgbouncer'], { encoding: 'utf8' }).stdout.trim().split('\n')[0]
  return found || undefined
}

export interface Pooler {
  url: string
  /** PgBouncer's pool mode. */
  mode: PoolMode
  /** SIGKILL to PgBouncer itself (a crash: every client and server connection cut at once); resolves once it is gone. */
  kill(): Promise<void>
  /** Starts it again on the same port after `kill`; resolves once it answers a query. */
  restart(): Promise<void>
  stop(): Promise<void>
}

export type PoolMode = 'transaction' | 'session'

/**
 * PgBouncer in front of `cluster`, in transaction mode (each transaction may get another server
 * connection) or session mode (a client keeps its server connection: LISTEN and prepared
 * statements work, and every client connection holds a server connection, so the pool is
 * sized for every gateway's connections at once). `statement_timeout` is among the startup
 * parameters it drops, as an operator's `ignore_startup_parameters` might (test/pgbouncer-modes.test.ts).
 */
export async function startPgbouncer(bin: string, cluster: Cluster, options: { mode?: PoolMode } = {}): Promise<Pooler> {
  const mode = options.mode ?? 'transaction'
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-pgbouncer-'))
  chmodSync(dir, 0o777)
  const port = await freePort()
  const ini = join(dir, 'pgbouncer.ini')
  writeFileSync(join(dir, 'users.txt'), '"postgres" ""\n')
  writeFileSync(ini, [
    '[databases]', `* = host=127.0.0.1 port=${cluster.port}`,
    '[pgbouncer]', 'listen_addr = 127.0.0.1', `listen_port = ${port}`, 'unix_socket_dir =',
    'auth_type = trust', `auth_file = ${join(dir, 'users.txt')}`, `pool_mode = ${mode}`,
    `default_pool_size = ${mode === 'session' ? 80 : 5}`, 'max_client_conn = 200', 'ignore_startup_parameters = application_name,extra_float_digits,statement_timeout',
  ].join('\n'))
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`
  let child = await launchPgbouncer(bin, ini, url)
  // The signal goes to pgbouncer itself (by its config path), not to runuser, which may not pass it on.
  const signal = (name: 'TERM' | 'KILL') => new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve()
    child.once('exit', () => resolve())
    spawnSync('pkill', [`-${name}`, '-f', ini])
  })
  return {
    url,
    mode,
    kill: () => signal('KILL'),
    async restart() {
      child = await launchPgbouncer(bin, ini, url)
    },
    // SIGINT would wait for every client to leave; SIGTERM ends it at once.
    stop: async () => {
      await signal('TERM')
      rmSync(dir, { recursive: true, force: true })
    },
  }
}

/** Starts PgBouncer with `ini`; resolves once it answers a query at `url` (bounded: 100 tries). */
async function launchPgbouncer(bin: string, ini: string, url: string): Promise<ChildProcess> {
  const [cmd, argv] = asPostgres(bin, [ini])
  const child = spawn(cmd, argv, { stdio: 'ignore' })
  for (let i = 0; ; i++) {
    const probe = postgres(url, { max: 1, prepare: false, fetch_types: false, onnotice: () => {}, connect_timeout: 1 })
    try {
      await probe`SELECT 1`
      return child
    } catch (err) {
      if (i >= 100 || child.exitCode !== null) throw err
      await new Promise((r) => setTimeout(r, 50))
    } finally {
      await probe.end({ timeout: 1 })
    }
  }
}
