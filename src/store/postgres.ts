import postgres from 'postgres'
import { passThrough, StoreError, toParams, storeUnlisten, toStoreError, type Db, type SqlValue } from './db.js'
import { createSlotWait, noSlotLeft, slotDeadline, type SlotWait } from './slots.js'

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
 * Connection health is owned here:
 * - No per-connection type lookup: its promise had no listener, and a connection dropped
 *   right after opening crashed the process.
 * - A short jittered reconnect delay per connection, instead of postgres.js's, which grows
 *   with a retry count the whole pool shares (up to 20 s).
 * - A client that lost a connection is retired whole: new statements go to a fresh client
 *   while the old one finishes what it runs. postgres.js 3.4.9 carries a dropped
 *   connection's state into its reconnect: the dead backend's `57P01`, replayed onto the next
 *   statement (porsager/postgres#1215, #1223), and a write it never flushed, which stalls the
 *   next startup until `connect_timeout` (porsager/postgres#1209). Until a retired client's
 *   statements finish (its `end` waits at most 5 s), its connections count on top of `max`.
 * - One retry, on the current client, of a statement that failed before it could have
 *   reached the server (`failedBeforeSending`).
 *
 * @example
 * const db = connectPostgres('postgres://postgres@127.0.0.1:5432/fencegate', { connectTimeoutMs: 1000 })
 */
export function connectPostgres(url: string, options: PostgresOptions = {}): Db {
  const max = options.max ?? 20
  const open = () => postgres(url, {
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
  let client = open()
  // LISTEN gets a client of its own, never retired: postgres.js re-listens after a drop.
  let listener: postgres.Sql | undefined
  const draining = new Set<Promise<void>>()
  // A failure that lost its connection retires the client it ran on, once.
  const failedOn = (failed: postgres.Sql, err: StoreError) => {
    if (failed !== client || !connectionLost(err)) return
    client = open()
    const done = failed.end({ timeout: 5 }).catch(() => {}).then(() => void draining.delete(done))
    draining.add(done)
  }
  const db = pooled(() => client, failedOn, options.pooler === 'transaction' ? inFlight(max) : undefined)
  return {
    ...db,
    listen: (channel, onNotify, onReconnect) => listenOn((listener ??= open()), channel, onNotify, onReconnect),
    async close() {
      await Promise.all([client.end({ timeout: 5 }), listener?.end({ timeout: 5 }), ...draining])
    },
  }
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
 * Whether postgres.js failed a statement before handing it to a connection, so that no
 * server can have run it. The driver stamps a query with its connection's backend (`state`)
 * the moment it writes it, and its own `cancel()` relies on that stamp the same way. Such
 * failures: the connection it waited for could not be opened (refused, timed out, a server
 * still starting), or the reconnect replayed a dead backend's `57P01` onto it (postgres.js
 * 3.4.9 keeps a terminated backend's last ErrorResponse across the reconnect and fails the
 * first statement queued for the new connection with it: porsager/postgres#1215, #1223). A statement
 * that was written and then cut off (a reset, a terminated backend) may have committed, and
 * is never retried.
 */
export function failedBeforeSending(query: unknown): boolean {
  return (query as { state?: unknown } | null)?.state === null
}

/**
 * Whether a failure means the connection under the statement is gone or never came up
 * (a driver or socket code, SQLSTATE class 08, or `57P0x`), not that a live connection
 * refused the statement.
 */
export function connectionLost(err: StoreError): boolean {
  return err.driverCode !== undefined || /^(08|57P0)/.test(err.sqlstate ?? '')
}

/**
 * A Db on a postgres.js client its caller configured: the Workers runtime opens
 * its own per-request client with Workers-specific options (src/runtime/workers/db.ts).
 * Without `listen`: such a client does not outlive its request, and is never retired.
 */
export function postgresClientDb(client: postgres.Sql): Db {
  return { ...pooled(() => client, () => {}), close: () => client.end({ timeout: 5 }) }
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

/** What becomes of the client a statement failed on (`connectPostgres` retires one that lost its connection). */
type FailedOn = (client: postgres.Sql, err: StoreError) => void

/** The Db on whichever client is current; every failure is reported with the client it ran on. */
function pooled(current: () => postgres.Sql, failedOn: FailedOn, gate: Gate = (run) => run()): Db {
  const slots = createSlotWait()
  const lost = (client: postgres.Sql) => (err: unknown) => {
    if (err instanceof StoreError) failedOn(client, err)
    throw err
  }
  return {
    kind: 'postgres',
    sql: <T>(strings: TemplateStringsArray, ...values: SqlValue[]) => gate(() => statement<T>(current, failedOn, slots, strings, values)),
    exec: (script) => gate(() => {
      const client = current()
      return client.unsafe(script).then(() => undefined, (err: unknown) => lost(client)(toStoreError(err)))
    }),
    begin: (fn) => gate(() => {
      const client = current()
      // Statements inside run on the transaction's own connection, outside the gate.
      // A transaction holds a connection too: its end frees one for a statement waiting for a slot.
      slots.started()
      return passThrough((track) => client.begin((tx) => track(fn(inTransaction(tx)))) as Promise<never>)
        .finally(() => slots.settled(true)).catch(lost(client))
    }),
    close: async () => {},
  }
}

/** The Db a transaction's callback gets: its statements run on the transaction's connection. */
function inTransaction(tx: postgres.TransactionSql): Db {
  return {
    kind: 'postgres',
    async sql<T>(strings: TemplateStringsArray, ...values: SqlValue[]) {
      try {
        return (await tx(strings, ...(toParams(values) as never[]))) as unknown as T[]
      } catch (err) {
        throw toStoreError(err)
      }
    },
    exec: (script) => tx.unsafe(script).then(() => undefined, (err: unknown) => { throw toStoreError(err) }),
    begin: () => Promise.reject(new Error('nested transactions are not used by fencegate')),
    close: async () => {},
  }
}

/**
 * One statement on the current client. A statement that lost its connection retires that
 * client; one that provably never reached a server is retried once, on the client current then.
 * One refused a slot for a new connection (53300) waits for a connection the pool has
 * (src/store/slots.ts) while other statements run to free one, until a connect timeout
 * passes with none served: a pool with no live connection fails as late as an unreachable
 * server does.
 */
async function statement<T>(current: () => postgres.Sql, failedOn: FailedOn, slots: SlotWait, strings: TemplateStringsArray, values: SqlValue[]): Promise<T[]> {
  const params = toParams(values) as never[]
  let retried = false
  let mayWait: (() => boolean) | undefined
  for (;;) {
    const client = current()
    const query = client(strings, ...params)
    slots.started()
    try {
      const rows = (await query) as unknown as T[]
      slots.settled(true)
      return rows
    } catch (raw) {
      const sent = !failedBeforeSending(query)
      slots.settled(sent)
      const err = toStoreError(raw)
      failedOn(client, err)
      if (sent) throw err
      if (err.sqlstate === noSlotLeft && slots.othersRunning() && (mayWait ??= slotDeadline(slots, client.options.connect_timeout * 1000))()) {
        await slots.nextFree()
      } else if (retried) {
        throw err
      } else {
        retried = true
      }
    }
  }
}
