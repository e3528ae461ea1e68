import postgres from 'postgres'
import type { Db } from '../../store/db.js'
import { postgresClientDb } from '../../store/postgres-pool.js'

/**
 * One request's connection to PostgreSQL. Workers forbids a socket opened in
 * one request from serving another, so every request pays the connection's
 * set-up; these options keep that set-up to the handshake itself:
 * - `max: 1`: a request's statements run one after another.
 * - `fetch_types: false`: postgres.js otherwise asks the server for its array
 *   types on every new connection, one extra round trip per request. fencegate
 *   never binds or reads an array: `SqlValue` (src/store/db.ts) has no array
 *   member, and the one `ARRAY(...)` in its SQL stays inside the statement.
 *
 * With a Hyperdrive binding the URL points at Hyperdrive's pool, which keeps
 * the connections to PostgreSQL warm (docs/workers-deployment.md).
 *
 * @example
 * const store = createStore(connectWorkersPostgres(env.HYPERDRIVE.connectionString))
 */
export function connectWorkersPostgres(url: string): Db {
  return postgresClientDb(postgres(url, {
    max: 1,
    fetch_types: false,
    connect_timeout: 5,
    onnotice: () => {},
    connection: { application_name: 'fencegate' },
  }))
}
