import type { StoreError } from './db.js'

/**
 * What a store failure most likely means to the operator starting a gateway, by its SQLSTATE
 * or driver code (never its message text). `fencegate serve` and `migrate` print it after the
 * code: "store failure (25006)" alone did not say that the host was a standby.
 */
const hints: Readonly<Record<string, string>> = {
  // PgBouncer's answer to a startup parameter it does not pass on ("unsupported startup parameter").
  '08P01': 'the server or a pooler in front of it refused the connection\'s startup: PgBouncer refuses a session setting given in store.url (?statement_timeout=...) unless it is in its ignore_startup_parameters; set the setting for the role instead (ALTER ROLE ... SET)',
  '25006': 'the node is read-only (a hot standby, or default_transaction_read_only is on): list the primary in store.url, or with several hosts add target_session_attrs=read-write or primary (any takes the first host that answers)',
  '3D000': 'the database named in store.url does not exist',
  '28P01': 'the server refused the password of the user in store.url',
  '28000': 'the server refused the user in store.url (pg_hba.conf)',
  '42501': 'the user in store.url may not create fencegate\'s tables and functions (see fencegate migrate)',
  '53300': 'the server has no connection slot left (max_connections)',
  '57P03': 'the server is starting up, shutting down or in recovery',
  ECONNREFUSED: 'nothing listens at the host and port of store.url',
  ENOTFOUND: 'the host of store.url does not resolve',
  CONNECT_TIMEOUT: 'no connection came up within store.connect_timeout',
}

/**
 * The operator's next step for a store failure, or undefined for a code without one.
 *
 * @example
 * storeFailureHint(new StoreError('3D000', undefined)) // 'the database named in store.url does not exist'
 */
export function storeFailureHint(err: StoreError): string | undefined {
  return hints[err.sqlstate ?? err.driverCode ?? '']
}
