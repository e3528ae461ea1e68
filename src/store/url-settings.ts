import type { Db } from './db.js'

/**
 * The query parameters of a store URL that postgres.js reads as its own options; every other
 * one it sends to the server as a startup parameter, a setting of the session
 * (`?statement_timeout=5s`, `?options=-c synchronous_commit=remote_apply`).
 */
const driverOptions = new Set(['max', 'ssl', 'sslmode', 'sslrootcert', 'sslnegotiation', 'idle_timeout', 'connect_timeout',
  'max_lifetime', 'max_pipeline', 'backoff', 'keep_alive', 'prepare', 'debug', 'fetch_types', 'publications', 'target_session_attrs',
  // fencegate sets its own; a pooler passes it on or drops it, and nothing depends on it.
  'application_name'])

/**
 * The server settings a store URL asks for as startup parameters, by name (lower case): its
 * query parameters that are not the driver's own, and the `-c name=value` or `--name=value`
 * of an `options` parameter.
 *
 * @example
 * urlSettings('postgres://db/fencegate?sslmode=require&statement_timeout=5s') // ['statement_timeout']
 */
export function urlSettings(url: string): string[] {
  const query = url.includes('?') ? new URLSearchParams(url.slice(url.indexOf('?') + 1)) : new URLSearchParams()
  const names: string[] = []
  for (const [name, value] of query) {
    if (name === 'options') names.push(...optionsSettings(value))
    else if (!driverOptions.has(name)) names.push(name)
  }
  return [...new Set(names.map((n) => n.toLowerCase()))]
}

/** `-c a=1 --b=2 -c c=3` → `a`, `b`, `c`. */
function optionsSettings(options: string): string[] {
  const words = options.trim().split(/\s+/)
  const names: string[] = []
  for (let i = 0; i < words.length; i++) {
    const word = words[i]!
    const pair = word === '-c' ? words[++i] : word.startsWith('-c') ? word.slice(2) : word.startsWith('--') ? word.slice(2) : undefined
    const name = pair?.split('=')[0]
    if (name) names.push(name.replace(/-/g, '_'))
  }
  return names
}

/**
 * The settings of `urlSettings(url)` that the session did not get from its startup packet
 * (`pg_settings.source` is not `client`): what a pooler in front of PostgreSQL dropped.
 * PgBouncer passes on only a few startup parameters; it refuses the others, or, listed in its
 * `ignore_startup_parameters`, drops them without a word, and a session would then run
 * without a setting the URL asked for. Resolves to the names, empty when every one holds.
 *
 * @example
 * await settingsNotInEffect(db, 'postgres://pgbouncer:6432/fencegate?statement_timeout=5s') // ['statement_timeout']
 */
export async function settingsNotInEffect(db: Db, url: string): Promise<string[]> {
  const missing: string[] = []
  for (const name of urlSettings(url)) {
    const [row] = await db.sql<{ source: string }>`SELECT source FROM pg_settings WHERE name = ${name}`
    if (row?.source !== 'client') missing.push(name)
  }
  return missing
}
