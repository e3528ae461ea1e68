import { ConfigError, type Config } from '../../config/schema.js'
import { storeCode } from '../../store/db.js'
import type { Db } from '../../store/db.js'
import { checkConnects, type PostgresOptions } from '../../store/postgres.js'
import { settingsNotInEffect } from '../../store/url-settings.js'

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

/**
 * Fails the start, naming each setting, when the store URL asks for a session setting
 * (`?statement_timeout=5s`) that the session does not have: a pooler dropped it
 * (docs/deployment.md#what-a-pooler-cannot-give). fencegate itself relies on no session
 * state (it sends no `SET`), but a setting the operator asked for must not vanish silently.
 *
 * @example
 * await requireUrlSettings(db, 'postgres://pgbouncer:6432/fencegate?statement_timeout=5s')
 */
export async function requireUrlSettings(db: Db, url: string): Promise<void> {
  const missing = await settingsNotInEffect(db, url)
  if (missing.length === 0) return
  throw new ConfigError(missing.map((name) => `store.url: the session setting ${name} asked for in the URL is not in effect (a pooler such as PgBouncer does not pass it on); set it for the role instead: ALTER ROLE ... SET ${name} = ...`))
}
