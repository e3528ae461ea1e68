import { loadConfigText } from '../../config/text.js'
import { purgeRetained } from '../retention.js'
import { createStore } from '../../store/store.js'
import { connectWorkersPostgres } from './db.js'

/**
 * The Workers cron's share of the retention purge (audit rows and fence
 * history past their retention), called from the Worker's scheduled handler.
 * It reads the same bindings as the Worker (FENCEGATE_CONFIG; HYPERDRIVE,
 * store.url or DATABASE_URL), opens one connection for the run and logs what
 * it deleted as one JSON line (a Worker has no /metrics to count it in).
 * Never throws: a failed purge is logged and retried by the next cron.
 *
 * @example
 * async scheduled(_c, env, ctx) { ctx.waitUntil(purgeRetainedOnWorkers(env)) }
 */
export async function purgeRetainedOnWorkers(env: { [binding: string]: unknown; HYPERDRIVE?: { connectionString: string } }): Promise<void> {
  const vars = Object.fromEntries(Object.entries(env).filter((e): e is [string, string] => typeof e[1] === 'string'))
  try {
    if (!vars.FENCEGATE_CONFIG) return
    const config = loadConfigText(vars.FENCEGATE_CONFIG, vars, 'FENCEGATE_CONFIG')
    if (config.audit.retention === undefined && config.fence_history.retention === undefined) return
    const databaseUrl = env.HYPERDRIVE?.connectionString || config.store.url || vars.DATABASE_URL
    if (!databaseUrl) return
    const store = createStore(connectWorkersPostgres(databaseUrl))
    try {
      const purged = await purgeRetained(store, config)
      console.log(JSON.stringify({ time: new Date().toISOString(), level: 'info', event: 'purged', audit: purged.audit, fence_history: purged.fence_history }))
    } finally {
      await store.close().catch(() => {})
    }
  } catch (err) {
    console.error(JSON.stringify({ time: new Date().toISOString(), level: 'error', event: 'purge_failed', error: (err as Error)?.name ?? typeof err }))
  }
}
