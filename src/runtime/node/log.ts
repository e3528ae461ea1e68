import { pino, stdTimeFunctions, type DestinationStream } from 'pino'
import type { LogFields, Logger, LogLevel } from '../../observe/log.js'

/**
 * The Node logger: pino behind the core's `Logger` seam. One JSON line per
 * event, in the same shape as the core's console logger, so the line format
 * does not depend on the runtime:
 * `{"level":"info","time":"2026-11-29T12:35:26.753Z","event":"request",...fields}`.
 * `event` is pino's message key; there is no pid or hostname. Callers pass only
 * identifiers, hashes, codes and durations (see docs/operations.md).
 *
 * `destination` defaults to stdout (asynchronous, flushed when the process exits).
 *
 * @example
 * const log = createPinoLogger('info')
 * log.info('listening', { data_url: 'http://127.0.0.1:8080' })
 */
export function createPinoLogger(level: LogLevel, destination?: DestinationStream, base?: Record<string, number | string>): Logger {
  const options = {
    level,
    messageKey: 'event',
    // With server.workers > 1 every line names its worker (`{ worker: 1 }`); otherwise none.
    base: base ?? null,
    timestamp: stdTimeFunctions.isoTime,
    formatters: { level: (label: string) => ({ level: label }) },
  }
  const p = destination ? pino(options, destination) : pino(options)
  return {
    debug: (event: string, fields: LogFields = {}) => p.debug(fields, event),
    info: (event: string, fields: LogFields = {}) => p.info(fields, event),
    warn: (event: string, fields: LogFields = {}) => p.warn(fields, event),
    error: (event: string, fields: LogFields = {}) => p.error(fields, event),
  }
}
