import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import type { Db } from '../src/store/db.js'
import { migrate } from '../src/store/migrate.js'
import { loadMigrations } from '../src/store/migrations-fs.js'
import { openPglite } from '../src/store/pglite.js'
import { connectPostgres } from '../src/store/postgres.js'
import type { BenchOptions } from './options.js'

/** What the run left in the store, to prove the load was what it claims to be. */
export interface StoreCheck {
  /** Entities whose highest fence is one this run presented. */
  entities: number
  /** Audit rows written since the run began: every rejection, stale or not. */
  rejections: number
  /** This run's idempotency records, by state (all `completed` when every key settled). */
  keys: Record<string, number>
}

export interface BenchStore {
  /** e.g. `PostgreSQL 15.4, synchronous_commit=on, fsync=on` */
  description: string
  /** Where the store is, for the report (never includes a password). */
  location: string
  /** Environment for the gateway child: DATABASE_URL, or none for the embedded store. */
  gatewayEnv(base: NodeJS.ProcessEnv): NodeJS.ProcessEnv
  /** The embedded store's directory, for the gateway config. */
  dataDir: string | undefined
  /** Only once the gateway has stopped: PGlite allows one process per directory. */
  check(fenceBase: bigint, since: Date, keyPrefix: string): Promise<StoreCheck>
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

async function describe(db: Db): Promise<string> {
  if (db.kind === 'pglite') {
    const [row] = await db.sql<{ v: string }>`SELECT current_setting('server_version') AS v`
    return `PGlite (embedded PostgreSQL ${row!.v}, in-process WASM)`
  }
  const [row] = await db.sql<{ v: string; sc: string; fsync: string }>`
    SELECT current_setting('server_version') AS v, current_setting('synchronous_commit') AS sc, current_setting('fsync') AS fsync`
  return `PostgreSQL ${row!.v}, synchronous_commit=${row!.sc}, fsync=${row!.fsync}`
}

async function check(db: Db, fenceBase: bigint, since: Date, keyPrefix: string): Promise<StoreCheck> {
  try {
    const [row] = await db.sql<Omit<StoreCheck, 'keys'>>`
      SELECT (SELECT count(*)::int FROM fg_fences WHERE highest_fence >= ${fenceBase.toString()}::bigint) AS entities,
             (SELECT count(*)::int FROM fg_audit WHERE at >= ${since.toISOString()}::timestamptz) AS rejections`
    // The prefix is the bench's own [a-z0-9] tag, so it needs no LIKE escaping.
    const states = await db.sql<{ state: string; n: number }>`
      SELECT state, count(*)::int AS n FROM fg_idempotency WHERE key LIKE ${`${keyPrefix}%`} GROUP BY state ORDER BY state`
    return { ...row!, keys: Object.fromEntries(states.map((r) => [r.state, r.n])) }
  } finally {
    await db.close()
  }
}

async function migrated(db: Db): Promise<string> {
  try {
    await migrate(db, loadMigrations())
    return await describe(db)
  } finally {
    await db.close()
  }
}

/**
 * Prepares the store the gateway will use: a given PostgreSQL database as-is, a
 * fresh one created for this run (and dropped by cleanup), or a temporary PGlite directory.
 */
export async function prepareStore(options: BenchOptions): Promise<BenchStore> {
  if (options.store === 'pglite') {
    const dataDir = mkdtempSync(join(tmpdir(), 'fencegate-bench-'))
    const description = await migrated(await openPglite(dataDir))
    return {
      description,
      location: dataDir,
      dataDir,
      gatewayEnv: (base) => {
        const env = { ...base }
        delete env.DATABASE_URL
        return env
      },
      check: async (fenceBase, since, keyPrefix) => check(await openPglite(dataDir), fenceBase, since, keyPrefix),
      cleanup: async () => rmSync(dataDir, { recursive: true, force: true }),
    }
  }

  let url = options.databaseUrl
  let drop = async () => {}
  if (!url) {
    const name = `fencegate_bench_${Date.now()}`
    const admin = postgres(options.adminUrl, { max: 1, connect_timeout: 5, onnotice: () => {} })
    try {
      await admin.unsafe(`CREATE DATABASE ${name}`)
    } finally {
      await admin.end({ timeout: 5 })
    }
    url = withDatabase(options.adminUrl, name)
    drop = async () => {
      const a = postgres(options.adminUrl, { max: 1, connect_timeout: 5, onnotice: () => {} })
      try {
        await a.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
      } finally {
        await a.end({ timeout: 5 })
      }
    }
  }
  const dbUrl = url
  let description: string
  try {
    description = await migrated(connectPostgres(dbUrl, { max: 1 }))
  } catch (err) {
    await drop()
    throw err
  }
  return {
    description,
    location: `${redact(dbUrl)}${options.databaseUrl ? ' (given; kept)' : ' (created for this run; dropped at the end)'}`,
    dataDir: undefined,
    gatewayEnv: (base) => ({ ...base, DATABASE_URL: dbUrl }),
    check: (fenceBase, since, keyPrefix) => check(connectPostgres(dbUrl, { max: 1 }), fenceBase, since, keyPrefix),
    cleanup: drop,
  }
}
