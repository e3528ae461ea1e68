/** Log levels, least to most severe; `silent` writes nothing. */
export type LogLevel = 'debug' | 'info' | 'warn' | 'error' | 'silent'
export type LogFields = Record<string, string | number | boolean | null | undefined>

/** One JSON line per event. Fields carry identifiers and hashes, never bodies or secrets. */
export interface Logger {
  debug(event: string, fields?: LogFields): void
  info(event: string, fields?: LogFields): void
  warn(event: string, fields?: LogFields): void
  error(event: string, fields?: LogFields): void
}

const rank: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 }

/**
 * A JSON-lines logger; `write` defaults to the console so it runs on any runtime.
 *
 * @example
 * const log = createLogger('info')
 * log.info('listening', { port: 8080 })
 */
export function createLogger(level: LogLevel, write: (line: string) => void = (line) => console.log(line)): Logger {
  const at = (l: Exclude<LogLevel, 'silent'>) => (event: string, fields: LogFields = {}) => {
    if (rank[l] < rank[level]) return
    write(JSON.stringify({ time: new Date().toISOString(), level: l, event, ...fields }))
  }
  return { debug: at('debug'), info: at('info'), warn: at('warn'), error: at('error') }
}

/** A logger that drops everything (for embedding and tests that do not read logs). */
export const silentLogger: Logger = createLogger('silent')
