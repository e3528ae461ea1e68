import { loadConfigFile } from '../config/load.js'
import type { Config } from '../config/schema.js'

/** A mistake in how a command was called: printed with the command's help, exit code 2. */
export class UsageError extends Error {
  override name = 'UsageError'
}

export type Flags = Record<string, string | boolean | undefined>

export function stringFlag(flags: Flags, name: string): string | undefined {
  const v = flags[name]
  return typeof v === 'string' ? v : undefined
}

export function portFlag(flags: Flags, name: string): number | undefined {
  const v = stringFlag(flags, name)
  if (v === undefined) return undefined
  if (!/^\d{1,5}$/.test(v) || Number(v) > 65535) throw new UsageError(`--${name} must be a port number, got ${JSON.stringify(v)}`)
  return Number(v)
}

/** Where the store lives for commands that only need the database: URL, else data directory. */
export function storeLocation(flags: Flags, env: NodeJS.ProcessEnv): { url: string | undefined; dataDir: string } {
  const configPath = stringFlag(flags, 'config')
  const config: Config | undefined = configPath ? loadConfigFile(configPath, env) : undefined
  return {
    url: stringFlag(flags, 'database-url') || config?.store.url || env.DATABASE_URL || undefined,
    dataDir: stringFlag(flags, 'data-dir') ?? config?.store.data_dir ?? '.fencegate',
  }
}
