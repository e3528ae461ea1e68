/**
 * The thin seam between fencegate's SQL and a driver. Store code writes plain
 * parameterised tagged templates against `Db`; postgres.js and PGlite each
 * provide one, so the same statements run on both.
 */
export type SqlValue = string | number | boolean | null | undefined | Uint8Array
export type Row = Record<string, unknown>

export interface Db {
  readonly kind: 'postgres' | 'pglite'
  /** Runs one parameterised statement: every `${value}` is a bind parameter, never text. */
  sql<T = Row>(strings: TemplateStringsArray, ...values: SqlValue[]): Promise<T[]>
  /** Runs a script of several statements without parameters (migrations only). */
  exec(script: string): Promise<void>
  /** Runs `fn` in one transaction; it commits when `fn` resolves and rolls back when it throws. */
  begin<T>(fn: (tx: Db) => Promise<T>): Promise<T>
  /**
   * Subscribes to a notification channel (`LISTEN`). `onNotify` gets each payload once the
   * notifying transaction has committed, so a listener never hears of a row it cannot see
   * yet. postgres.js listens on one dedicated connection and re-listens after that
   * connection drops; `onReconnect` runs then, because notifications sent while it was
   * down are lost. PGlite is one in-process session and never reconnects.
   *
   * Optional: a runtime without a lasting connection (the Workers entry opens one per
   * request) has no `listen`, and its callers fall back to polling. Resolves to the
   * function that unsubscribes; rejects with a StoreError when the `LISTEN` fails.
   *
   * @example
   * const unlisten = await db.listen?.('fencegate_jobs', (type) => console.log('work for', type))
   */
  listen?(channel: string, onNotify: (payload: string) => void, onReconnect?: () => void): Promise<() => Promise<void>>
  close(): Promise<void>
}

/**
 * A failure of the store, carrying only the SQLSTATE or driver code: the
 * driver's message may quote data and never reaches a client or a log.
 */
export class StoreError extends Error {
  override name = 'StoreError'
  /** Set by the pool when the statement provably never reached a server, so it changed nothing. */
  unsent = false
  constructor(readonly sqlstate: string | undefined, readonly driverCode: string | undefined) {
    super(`store failure (${sqlstate ?? driverCode ?? 'unknown'})`)
  }
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
 * Whether a failed statement may still have committed: it was sent and then its connection
 * was lost, so its answer never came. A statement a live connection refused was rolled back.
 */
export function mayHaveCommitted(err: StoreError): boolean {
  return !err.unsent && connectionLost(err)
}

/** The code a log line may carry for a failure: the SQLSTATE or driver code, never the message. */
export function storeCode(err: unknown): string {
  return err instanceof StoreError ? (err.sqlstate ?? err.driverCode ?? 'unknown') : 'unknown'
}

/** A SQLSTATE: five digits or capitals. */
export const sqlstatePattern = /^[0-9A-Z]{5}$/

/** Wraps any driver error into a StoreError, recognising the SQLSTATE when there is one. */
export function toStoreError(err: unknown): StoreError {
  if (err instanceof StoreError) return err
  const code = (err as { code?: unknown } | null)?.code
  if (typeof code === 'string' && sqlstatePattern.test(code)) return new StoreError(code, undefined)
  return new StoreError(undefined, typeof code === 'string' ? code.slice(0, 40) : undefined)
}

/** A driver's unlisten whose failures become StoreErrors, as every other call's do. */
export function storeUnlisten(unlisten: () => Promise<unknown>): () => Promise<void> {
  return async () => {
    try {
      await unlisten()
    } catch (err) {
      throw toStoreError(err)
    }
  }
}

/** SQLSTATEs fencegate reacts to by name. */
export const sqlstate = {
  uniqueViolation: '23505',
  serializationFailure: '40001',
  deadlockDetected: '40P01',
} as const

/**
 * Rolled back by PostgreSQL to break a deadlock or a serialization conflict (SQLSTATE class
 * 40): the statement changed nothing, so running it again is safe.
 */
export function rolledBack(err: unknown): boolean {
  return err instanceof StoreError && err.sqlstate?.startsWith('40') === true
}

/**
 * Runs a single-statement store call, again (up to `attempts` in all) when PostgreSQL
 * rolled it back for concurrency. Only for a call that is one statement: a rolled-back
 * statement left nothing behind.
 *
 * @example
 * const rows = await retryRolledBack(() => db.sql`UPDATE fg_jobs SET ... RETURNING id`)
 */
export async function retryRolledBack<T>(run: () => Promise<T>, attempts = 3): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await run()
    } catch (err) {
      if (attempt >= attempts || !rolledBack(err)) throw err
    }
  }
}

/** A whole number written into a statement's text rather than bound (see `withInlined`). */
export interface Inlined {
  readonly inlined: number
}

/** Marks a whole number to be written into the statement's text; anything else is refused. */
export function inlined(n: number): Inlined {
  if (!Number.isSafeInteger(n)) throw new RangeError(`only a whole number is written into a statement, got ${n}`)
  return { inlined: n }
}

/**
 * A tagged template over `db.sql` in which `inlined(n)` values are written into the text and
 * every other value stays a bind parameter. For a `LIMIT` the planner must see: a bound one
 * is estimated as a tenth of the table, so PostgreSQL plans such a statement anew on every
 * call. Each distinct number gives a statement text of its own, kept prepared like any other.
 *
 * @example
 * await withInlined<{ id: string }>(db)`SELECT id FROM fg_jobs WHERE tenant = ${tenant} LIMIT ${inlined(max)}`
 */
export function withInlined<T = Row>(db: Pick<Db, 'sql'>) {
  return (strings: TemplateStringsArray, ...values: (SqlValue | Inlined)[]): Promise<T[]> => {
    const text: string[] = [strings[0]!]
    const bound: SqlValue[] = []
    values.forEach((value, i) => {
      if (value !== null && typeof value === 'object' && 'inlined' in value) text[text.length - 1] += String(value.inlined) + strings[i + 1]!
      else {
        bound.push(value)
        text.push(strings[i + 1]!)
      }
    })
    return db.sql<T>(Object.assign(text, { raw: text }) as unknown as TemplateStringsArray, ...bound)
  }
}

/** Joins a template into `$1, $2, ...` text for drivers that take (text, params). */
export function toNumbered(strings: TemplateStringsArray): string {
  let text = strings[0]!
  for (let i = 1; i < strings.length; i++) text += `$${i}${strings[i]}`
  return text
}

export function toParams(values: SqlValue[]): unknown[] {
  return values.map((v) => (v === undefined ? null : v))
}

/**
 * Runs a driver transaction, letting errors thrown by fencegate's own code in
 * it pass unchanged while driver failures become StoreErrors.
 */
export async function passThrough<T>(run: (track: <U>(inner: Promise<U>) => Promise<U>) => Promise<T>): Promise<T> {
  const own = new Set<unknown>()
  const track = <U>(inner: Promise<U>) => inner.catch((err: unknown) => {
    own.add(err)
    throw err
  })
  try {
    return await run(track)
  } catch (err) {
    throw own.has(err) ? err : toStoreError(err)
  }
}
