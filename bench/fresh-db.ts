// The bench's PostgreSQL: a fresh database per run on the server at --database-url
// (dropped at the end, also after a failure or Ctrl-C). The gateway migrates it itself at
// start (as `fencegate serve` always does); the hand-rolled reference gets its own tables.
import postgres from 'postgres'

/** The hand-rolled reference's tables (bench/ref-fence.ts). */
export const referenceSchema = `
  CREATE TABLE hand_fences (entity text PRIMARY KEY, fence bigint NOT NULL);
  CREATE TABLE hand_keys (
    key text PRIMARY KEY, request_hash text NOT NULL, status int, content_type text, body bytea,
    created_at timestamptz NOT NULL DEFAULT now())`

export interface BenchStore {
  /** e.g. `PostgreSQL 15.4, synchronous_commit=on, fsync=on` */
  description: string
  /** The fresh database's URL (never printed with a password). */
  url: string
  /** Redacted, for the report. */
  location: string
  /** The server's TCP port, to count each system's connections to it. */
  port: number
  /**
   * The pids whose CPU counts as PostgreSQL's for this run: the backends connected to this
   * run's database and the server's background processes (WAL writer, checkpointer, ...),
   * not other databases' backends on a shared server.
   */
  pids(): Promise<Set<number>>
  cleanup(): Promise<void>
}

function withDatabase(url: string, database: string): string {
  const u = new URL(url)
  u.pathname = `/${database}`
  return u.toString()
}

function redact(url: string): string {
  const u = new URL(url)
  if (u.password) u.password = '***'
  return u.toString()
}

export async function prepareStore(serverUrl: string): Promise<BenchStore> {
  const name = `fencegate_bench_${Date.now()}`
  const admin = postgres(serverUrl, { max: 1, connect_timeout: 5, onnotice: () => {} })
  const url = withDatabase(serverUrl, name)
  try {
    await admin.unsafe(`CREATE DATABASE ${name}`)
    const db = postgres(url, { max: 1, connect_timeout: 5, onnotice: () => {} })
    let description: string
    try {
      await db.unsafe(referenceSchema)
      const [row] = await db<{ v: string; sc: string; fsync: string }[]>`
        SELECT current_setting('server_version') AS v, current_setting('synchronous_commit') AS sc, current_setting('fsync') AS fsync`
      description = `PostgreSQL ${row!.v}, synchronous_commit=${row!.sc}, fsync=${row!.fsync}`
    } finally {
      await db.end({ timeout: 5 })
    }
    return {
      description,
      url,
      location: `${redact(url)} (created for this run; dropped at the end)`,
      port: Number(new URL(url).port || 5432),
      pids: async () => {
        const rows = await admin<{ pid: number }[]>`
          SELECT pid FROM pg_stat_activity WHERE datname = ${name} OR backend_type <> 'client backend'`
        return new Set(rows.map((r) => r.pid))
      },
      cleanup: async () => {
        try {
          await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
        } finally {
          await admin.end({ timeout: 5 })
        }
      },
    }
  } catch (err) {
    await admin.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => {})
    await admin.end({ timeout: 5 })
    throw err
  }
}
