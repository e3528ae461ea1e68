import { sqlstatePattern, StoreError } from '../../store/db.js'
import type { Logger } from '../../observe/log.js'

// SQLSTATE classes of a store that is down, restarting or refusing connections:
// 08 connection exception, 53 insufficient resources, 57 operator intervention (57P01 is
// pg_terminate_backend, 57P03 a server still starting), 58 system error.
const storeClasses = new Set(['08', '53', '57', '58'])
// postgres.js's own connection codes and the socket errors it passes through.
const driverCodes = new Set([
  'CONNECTION_CLOSED', 'CONNECTION_DESTROYED', 'CONNECTION_ENDED', 'CONNECT_TIMEOUT',
  'ECONNRESET', 'ECONNREFUSED', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN',
])

/**
 * Whether an error is the store failing (a connection dropped, refused or terminated) rather
 * than a fault in fencegate's code. Recognised by code, never by message.
 */
export function isStoreFailure(err: unknown): boolean {
  if (err instanceof StoreError) return true
  const code = (err as { code?: unknown } | null)?.code
  if (typeof code !== 'string') return false
  return driverCodes.has(code) || (sqlstatePattern.test(code) && storeClasses.has(code.slice(0, 2)))
}

/**
 * The process-level policy of `fencegate serve`: a store failure that escaped as an unhandled
 * rejection (a driver's internal promise, a connection dropped between two statements) is
 * logged with its code and the gateway keeps serving, since every request path already fails
 * closed on its own; anything else is a programming error, printed in full, and the process
 * exits 1 so a supervisor restarts it.
 *
 * @example
 * installProcessPolicy(createPinoLogger('info'))
 */
export function installProcessPolicy(log: Logger, exit: (code: number) => void = (code) => process.exit(code)): () => void {
  const onRejection = (reason: unknown) => {
    if (isStoreFailure(reason)) {
      const code = (reason as { sqlstate?: string; driverCode?: string; code?: string })
      log.warn('store_failure_unhandled', { store_code: code.sqlstate ?? code.driverCode ?? code.code ?? 'unknown' })
      return
    }
    console.error('fencegate: unhandled rejection, exiting:', reason)
    exit(1)
  }
  process.on('unhandledRejection', onRejection)
  return () => process.off('unhandledRejection', onRejection)
}
