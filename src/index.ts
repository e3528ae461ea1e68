/**
 * fencegate's public API on Node: the two planes as Hono apps (and the data plane's pipeline
 * with its Node listener), the gateway started on Node, the stores, the undici forward, configuration and the error catalog. The worker
 * SDK is `fencegate/client`, the upstream's attestation check `fencegate/verify`; the
 * Workers entry is src/runtime/workers/entry.ts (wrangler.toml).
 *
 * @example
 * import { createApp, createStore, createUndiciForward, openPglite, parseConfig } from 'fencegate'
 *
 * const config = parseConfig({ routes: [{ name: 'capture', method: 'POST', path: '/payments/:id/capture',
 *   upstream: 'http://127.0.0.1:9001', entity: 'invoice:{params.id}', fence: 'required' }] })
 * const store = createStore(await openPglite())
 * const app = createApp({ config, store, forward: createUndiciForward().forward })
 * const res = await app.request('/payments/42/capture', { method: 'POST', headers: { 'x-execution-fence': '7' } })
 */
export { createApp, createDataPlane, requestIdOf, type AppDeps, type HandleCommand } from './gateway/app.js'
export { webInbound, type Inbound } from './http/inbound.js'
export { toResponse, type Answer, type HeaderView } from './http/exchange.js'
export type { Forward, ForwardRequest } from './gateway/forward.js'
export { createAdminApp, type AdminDeps } from './admin/app.js'
export { startGateway, openDb, databaseUrlFor, dataPlaneListener, type RunningGateway } from './runtime/node/gateway.js'
export { createUndiciForward, type UndiciForward } from './runtime/node/forward.js'
export { installProcessPolicy } from './runtime/node/process-policy.js'
export { createStore, type Store, type StoreOptions } from './store/store.js'
export { openPglite } from './store/pglite.js'
export { connectPostgres, type PostgresOptions } from './store/postgres.js'
export { migrate } from './store/migrate.js'
export { loadMigrations } from './store/migrations-fs.js'
export { StoreError, type Db } from './store/db.js'
export { createJobStore, type JobStore } from './leases/store.js'
export { parseConfig, ConfigError, type Config, type RouteConfig } from './config/schema.js'
export { loadConfigFile } from './config/load.js'
export { loadConfigText } from './config/text.js'
export { FencegateError, problemCatalog, type ProblemCode } from './http/problems.js'
export { createAuthenticator, noAuthentication, type Authenticate, type Identity } from './http/identity.js'
