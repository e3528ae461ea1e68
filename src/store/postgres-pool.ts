import type postgres from 'postgres'
import { connectionLost, passThrough, StoreError, toParams, toStoreError, type Db, type SqlValue } from './db.js'
import { createSlotGate, refusedConnection, type SlotGate } from './slots.js'

/**
 * The Db over postgres.js clients that every runtime shares: statements with their retries,
 * transactions, and the hold on a pool the server gives no new connection
 * (src/store/slots.ts). The Node pool (src/store/postgres.ts) adds its sockets, the retiring
 * of a client that lost a connection, and LISTEN; the Workers entry a client per request.
 */

export type Gate = <T>(run: () => Promise<T>) => Promise<T>

/**
 * At most `max` statements (or transactions) at a time, the rest waiting their turn here.
 * postgres.js pipelines a statement onto a busy connection only when none is idle; with no
 * more statements than connections, every statement finds an idle one, since a connection is
 * idle again before its statement's promise settles.
 */
export function inFlight(max: number): Gate {
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

export { connectionLost }

/**
 * Whether a live connection refused a write because its node is read-only: a hot standby
 * (`25006`, or `0A000` for what a standby cannot do at all) or a primary set read-only. The
 * statement changed nothing, so it may run again on the primary.
 */
export function refusedWrite(err: StoreError): boolean {
  return err.sqlstate === '25006' || err.sqlstate === '0A000'
}

/** What becomes of the client a statement failed on (`connectPostgres` retires one that lost its connection). */
export type FailedOn = (client: postgres.Sql, err: StoreError) => void

/**
 * A Db on a postgres.js client its caller configured: the Workers runtime opens
 * its own per-request client with Workers-specific options (src/runtime/workers/db.ts).
 * Without `listen`: such a client does not outlive its request, and is never retired.
 */
export function postgresClientDb(client: postgres.Sql): Db {
  return { ...pooled(() => client, () => {}, createSlotGate(client.options.connect_timeout * 1000, (client.options.idle_timeout ?? 60) * 1000)), close: () => client.end({ timeout: 5 }) }
}

/**
 * The Db on whichever client is current; every failure is reported with the client it ran on.
 * `slots` is the pool's hold (the socket factory of a Node pool asks it before opening).
 */
export function pooled(current: () => postgres.Sql, failedOn: FailedOn, slots: SlotGate, gate: Gate = (run) => run()): Db {
  return {
    kind: 'postgres',
    sql: <T>(strings: TemplateStringsArray, ...values: SqlValue[]) => gate(() => statement<T>(current, failedOn, slots, strings, values)),
    exec: (script) => gate(() => connected(current, failedOn, slots, (client) =>
      client.unsafe(script).then(() => undefined, (err: unknown) => { throw toStoreError(err) }))),
    // Statements inside run on the transaction's own connection, outside the gate.
    begin: (fn) => gate(() => connected(current, failedOn, slots, (client, started) =>
      passThrough((track) => client.begin((tx) => {
        started()
        return track(fn(inTransaction(tx)))
      }) as Promise<never>))),
    close: async () => {},
  }
}

/**
 * Whether a statement that never reached a server waits for a live connection and runs
 * again: its connection was one the held pool did not open, or one the server refused while
 * the pool has others. Such a failure lost no connection, so it retires no client.
 */
function waitsForSlot(slots: SlotGate, err: StoreError): boolean {
  return slots.held(err) || (refusedConnection(err) && slots.refused(err))
}

/**
 * A script or a transaction on the current client, run again after its turn when its
 * connection could not be had: then it never started (postgres.js calls a transaction's
 * callback, which reports `started`, only once its connection is reserved). Its end lets a
 * waiting statement take the connection it held.
 */
async function connected<T>(current: () => postgres.Sql, failedOn: FailedOn, slots: SlotGate, run: (client: postgres.Sql, started: () => void) => Promise<T>): Promise<T> {
  let waited = false
  for (;;) {
    const client = current()
    let began = false
    slots.entered()
    try {
      const result = await run(client, () => void (began = true))
      slots.left(undefined, true)
      return result
    } catch (err) {
      // Anything else is fencegate's own, thrown inside a transaction (passThrough lets it out unchanged).
      if (!(err instanceof StoreError)) {
        slots.left(undefined, true)
        throw err
      }
      slots.left(undefined, began && !connectionLost(err))
      if (!began && waitsForSlot(slots, err)) {
        await slots.turn(waited).catch(unsentRefusal)
        waited = true
        continue
      }
      failedOn(client, err)
      throw err
    }
  }
}

/** A wait for a live connection that timed out: the statement behind it never left. */
function unsentRefusal(err: StoreError): never {
  err.unsent = true
  throw err
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
 * So is one a read-only node refused (a standby, after a failover).
 * One whose connection could not be had while the pool has live ones takes its turn on those
 * (src/store/slots.ts), as often as it takes.
 */
async function statement<T>(current: () => postgres.Sql, failedOn: FailedOn, slots: SlotGate, strings: TemplateStringsArray, values: SqlValue[]): Promise<T[]> {
  const params = toParams(values) as never[]
  let retried = false
  let waited = false
  for (;;) {
    const client = current()
    slots.entered()
    const query = client(strings, ...params)
    let rows: T[]
    try {
      rows = (await query) as unknown as T[]
    } catch (raw) {
      const sent = !failedBeforeSending(query)
      const err = toStoreError(raw)
      slots.left(query, sent && !connectionLost(err))
      if (!sent && waitsForSlot(slots, err)) {
        await slots.turn(waited).catch(unsentRefusal)
        waited = true
        continue
      }
      failedOn(client, err)
      err.unsent = !sent
      // A write refused by a read-only node committed nothing: once more, on the client after it.
      if ((sent && !refusedWrite(err)) || retried) throw err
      retried = true
      continue
    }
    slots.left(query, true)
    return whole(rows)
  }
}

/**
 * The rows of an answer, or a store failure when its first row is a hole. postgres.js 3.4.9
 * does not reset its row index when an error follows rows already sent, and answers the next
 * statement on that connection with as many holes before its own rows (migrations/0018): the
 * statement ran, but its answer cannot be read, so it fails as one whose connection was lost
 * (it may have committed), never as a TypeError or with rows that are not its own.
 */
function whole<T>(rows: T[]): T[] {
  if (rows.length > 0 && !(0 in rows)) throw new StoreError(undefined, 'FENCEGATE_ROWS_MISSING')
  return rows
}
