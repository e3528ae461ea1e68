import { ConfigError, type Config } from '../../config/schema.js'
import { storeCode } from '../../store/db.js'
import { checkConnects, type PostgresOptions } from '../../store/postgres.js'

/**
 * The pool's options from `store.*`, with `store.listen_url` checked first: it needs a
 * PostgreSQL store, and it must connect, or the start fails naming it (a wrong one would
 * otherwise leave rule changes and job wake-ups to the fallback polls without a word).
 *
 * @example
 * const db = await openDb(url, config.store.data_dir, await storeOptions(config, url, 20))
 */
export async function storeOptions(config: Config, databaseUrl: string | undefined, max: number): Promise<PostgresOptions> {
  const { listen_url: listenUrl, connect_timeout: connectTimeoutMs, pooler } = config.store
  if (listenUrl !== undefined) {
    if (!databaseUrl) throw new ConfigError(['store.listen_url: needs a PostgreSQL store (store.url or DATABASE_URL); the embedded store has no LISTEN to give a connection'])
    await checkConnects(listenUrl, connectTimeoutMs).catch((err: unknown) => {
      throw new ConfigError([`store.listen_url: cannot connect (${storeCode(err)})`])
    })
  }
  return { connectTimeoutMs, pooler, max, ...(listenUrl !== undefined ? { listenUrl } : {}) }
}
