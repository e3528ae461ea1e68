import postgres from 'postgres'
import { passThrough, toParams, storeUnlisten, toStoreError, type Db, type SqlValue } from './db.js'

export interface PostgresOptions {
  /** Pool size; the default suits one gateway process. */
  max?: number
}

/**
 * A Db on PostgreSQL through postgres.js. Statements are prepared and every
 * commit is durable (the server's synchronous_commit decides, default on).
 *
 * @example
 * const db = connectPostgres('postgres://postgres@127.0.0.1:5432/fencegate')
 */
export function connectPostgres(url: string, options: PostgresOptions = {}): Db {
  const client = postgres(url, {
    max: options.max ?? 20,
    connect_timeout: 5,
    idle_timeout: 60,
    onnotice: () => {},
    connection: { application_name: 'fencegate' },
  })
  return { ...wrap(client), listen: (channel, onNotify, onReconnect) => listenOn(client, channel, onNotify, onReconnect) }
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

function wrap(sql: postgres.Sql | postgres.TransactionSql): Db {
  const db: Db = {
    kind: 'postgres',
    async sql<T>(strings: TemplateStringsArray, ...values: SqlValue[]): Promise<T[]> {
      try {
        return (await sql(strings, ...(toParams(values) as never[]))) as unknown as T[]
      } catch (err) {
        throw toStoreError(err)
      }
    },
    async exec(script) {
      try {
        await sql.unsafe(script)
      } catch (err) {
        throw toStoreError(err)
      }
    },
    async begin(fn) {
      if (!('begin' in sql)) throw new Error('nested transactions are not used by fencegate')
      return passThrough((track) => sql.begin((tx) => track(fn(wrap(tx)))) as Promise<never>)
    },
    async close() {
      if ('end' in sql) await sql.end({ timeout: 5 })
    },
  }
  return db
}
