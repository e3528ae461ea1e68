import postgres from 'postgres'
import { passThrough, toParams, storeUnlisten, toStoreError, type Db, type SqlValue } from './db.js'

export interface PostgresOptions {
  /** Pool size; the default suits one gateway process. */
  max?: number
  /**
   * How long a statement may wait for a connection to open, in milliseconds (default 1000,
   * `store.connect_timeout`). With the store unreachable, this bounds every refusal.
   */
  connectTimeoutMs?: number
  /**
   * `transaction` behind a pooler in transaction mode (PgBouncer before 1.21): no named
   * prepared statements (the next statement may land on another server connection) and
   * no pipelining (requests hung there when statements queued on one connection, test/pgbouncer.test.ts).
   */
  pooler?: 'none' | 'transaction'
}

/**
 * A Db on PostgreSQL through postgres.js. Statements are prepared and every
 * commit is durable (the server's synchronous_commit decides, default on).
 *
 * Connection health is owned here: no per-connection type lookup (its promise had no
 * listener, and a connection dropped right after opening crashed the process), a short
 * jittered reconnect delay per connection instead of postgres.js's, which grows with a
 * retry count the whole pool shares (up to 20 s), and one retry, on a fresh connection,
 * of a statement that failed before it could have reached the server.
 *
 * @example
 * const db = connectPostgres('postgres://postgres@127.0.0.1:5432/fencegate', { connectTimeoutMs: 1000 })
 */
export function connectPostgres(url: string, options: PostgresOptions = {}): Db {
  const max = options.max ?? 20
  const client = postgres(url, {
    max,
    // postgres.js takes seconds; fractions work (it multiplies by 1000 for its timer).
    connect_timeout: (options.connectTimeoutMs ?? 1000) / 1000,
    idle_timeout: 60,
    // fencegate binds no array parameters and reads no array columns.
    fetch_types: false,
    prepare: options.pooler !== 'transaction',
    // Behind a transaction pooler no statement may queue behind another on one client
    // connection (requests through PgBouncer 1.18 hung when they did): at most one waits here
    // (postgres.js needs 1 for its transactions), and `inFlight` below keeps it at none.
    ...(options.pooler === 'transaction' ? { max_pipeline: 1 } : {}),
    backoff: reconnectDelaySeconds,
    onnotice: () => {},
    connection: { application_name: 'fencegate' },
  })
  const db = wrap(client, options.pooler === 'transaction' ? inFlight(max) : undefined)
  return { ...db, listen: (channel, onNotify, onReconnect) => listenOn(client, channel, onNotify, onReconnect) }
}

type Gate = <T>(run: () => Promise<T>) => Promise<T>

/**
 * At most `max` statements (or transactions) at a time, the rest waiting their turn here.
 * postgres.js pipelines a statement onto a busy connection only when none is idle; with no
 * more statements than connections, every statement finds an idle one, since a connection is
 * idle again before its statement's promise settles.
 */
function inFlight(max: number): Gate {
  let running = 0
  const waiting: (() => void)[] = []
  return async (run) => {
    if (running >= max) await new Promise<void>((resolve) => waiting.push(resolve))
    else running++
    try {
      return await run()
    } finally {
      const next = waiting.shift()
      if (next) next()
      else running--
    }
  }
}

/**
 * The wait before a closed connection reconnects: 50–250 ms at random, whatever the pool's
 * shared retry count says. The jitter keeps a pool's connections from reconnecting in step
 * after a restart; the cap keeps the first request after the store returns fast.
 */
export function reconnectDelaySeconds(): number {
  return 0.05 + Math.random() * 0.2
}

/**
 * Failures that prove the statement never reached a server: the connection it was queued
 * on could not be opened (refused, unresolvable, timed out, or the server is still starting).
 * Only these are retried. A connection that broke after the statement was written (a reset,
 * `57P01` from `pg_terminate_backend`) may have committed it, and is never retried.
 */
const neverSent = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EHOSTUNREACH', 'ENETUNREACH', 'CONNECT_TIMEOUT', '57P03'])

/** Whether a driver error proves its statement was not sent (see `neverSent`). */
export function failedBeforeSending(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code
  return typeof code === 'string' && neverSent.has(code)
}

/**
 * A Db on a postgres.js client its caller configured: the Workers runtime opens
 * its own per-request client with Workers-specific options (src/runtime/workers/db.ts).
 * Without `listen`: such a client does not outlive its request.
 */
export function postgresClientDb(client: postgres.Sql): Db {
  return wrap(client)
}

/**
 * LISTEN through postgres.js: one dedicated connection for every channel of this client,
 * which postgres.js re-opens (with backoff) and re-listens on after it drops. Its
 * `onlisten` runs on the first LISTEN and on every re-listen; only the re-listens are reported.
 */
async function listenOn(sql: postgres.Sql, channel: string, onNotify: (payload: string) => void, onReconnect?: () => void): Promise<() => Promise<void>> {
  let first = true
  try {
    const { unlisten } = await sql.listen(channel, onNotify, () => {
      if (!first) onReconnect?.()
      first = false
    })
    return storeUnlisten(unlisten)
  } catch (err) {
    throw toStoreError(err)
  }
}

function wrap(sql: postgres.Sql | postgres.TransactionSql, gate: Gate = (run) => run()): Db {
  const db: Db = {
    kind: 'postgres',
    sql: <T>(strings: TemplateStringsArray, ...values: SqlValue[]) => gate(() => statement<T>(sql, strings, values)),
    exec: (script) => gate(async () => {
      try {
        await sql.unsafe(script)
      } catch (err) {
        throw toStoreError(err)
      }
    }),
    begin: (fn) => gate(async () => {
      if (!('begin' in sql)) throw new Error('nested transactions are not used by fencegate')
      // Statements inside run on the transaction's own connection, outside the gate.
      return passThrough((track) => sql.begin((tx) => track(fn(wrap(tx)))) as Promise<never>)
    }),
    async close() {
      if ('end' in sql) await sql.end({ timeout: 5 })
    },
  }
  return db
}

/** One statement, retried once on a fresh connection when it provably never reached a server. */
async function statement<T>(sql: postgres.Sql | postgres.TransactionSql, strings: TemplateStringsArray, values: SqlValue[]): Promise<T[]> {
  const params = toParams(values) as never[]
  try {
    return (await sql(strings, ...params)) as unknown as T[]
  } catch (err) {
    // Inside a transaction the connection is the transaction's: no fresh one to retry on.
    if (!failedBeforeSending(err) || !('begin' in sql)) throw toStoreError(err)
  }
  try {
    return (await sql(strings, ...params)) as unknown as T[]
  } catch (err) {
    throw toStoreError(err)
  }
}
