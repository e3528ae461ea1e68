import { parseArgs } from 'node:util'

export interface BenchOptions {
  duration: number
  warmup: number
  connections: number
  ids: number
  store: 'postgres' | 'pglite'
  /** Used as the store as-is (migrated, never dropped). */
  databaseUrl: string | undefined
  /** Where a throwaway database is created when no databaseUrl is given. */
  adminUrl: string
}

export const defaultAdminUrl = 'postgres://postgres@127.0.0.1:5432/test'

const flags = {
  duration: { type: 'string', help: 'measured seconds per scenario (default 10)' },
  warmup: { type: 'string', help: 'warm-up seconds per scenario, discarded (default 5)' },
  connections: { type: 'string', help: 'concurrent HTTP connections (default 50)' },
  ids: { type: 'string', help: 'invoice ids the spread scenario draws from (default 10000)' },
  store: { type: 'string', help: 'postgres (default) or pglite (embedded, in a temporary directory)' },
  'database-url': { type: 'string', help: 'PostgreSQL database to use as-is (else DATABASE_URL; else a fresh database is created and dropped)' },
  'admin-url': { type: 'string', help: `where that fresh database is created (default ${defaultAdminUrl})` },
  help: { type: 'boolean', help: 'show this help' },
} as const

export function usage(): string {
  const lines = [
    'usage: npm run bench -- [options]',
    '',
    'Loads a fencegate gateway (child process) over loopback with autocannon and compares',
    'passthrough, fenced-spread and fenced-hot forwarding in one run.',
    '',
    'options:',
  ]
  for (const [name, f] of Object.entries(flags)) lines.push(`  --${name}${f.type === 'string' ? ' <value>' : ''}`.padEnd(28) + f.help)
  return lines.join('\n')
}

export class UsageError extends Error {
  override name = 'UsageError'
}

function integer(value: string | undefined, name: string, fallback: number, min: number, max: number): number {
  if (value === undefined) return fallback
  if (!/^\d+$/.test(value) || Number(value) < min || Number(value) > max) {
    throw new UsageError(`--${name} must be an integer from ${min} to ${max}, got ${JSON.stringify(value)}`)
  }
  return Number(value)
}

/** Parses argv; returns undefined when --help was asked for. */
export function parseOptions(argv: string[], env: NodeJS.ProcessEnv): BenchOptions | undefined {
  let values
  try {
    const options = Object.fromEntries(Object.entries(flags).map(([k, f]) => [k, { type: f.type }]))
    values = parseArgs({ args: argv, options, strict: true, allowPositionals: false }).values as Record<string, string | boolean | undefined>
  } catch (err) {
    throw new UsageError((err as Error).message)
  }
  if (values.help) return undefined
  const str = (name: string) => (typeof values[name] === 'string' ? (values[name] as string) : undefined)
  const store = str('store') ?? 'postgres'
  if (store !== 'postgres' && store !== 'pglite') throw new UsageError(`--store must be postgres or pglite, got ${JSON.stringify(store)}`)
  const databaseUrl = str('database-url') || env.DATABASE_URL || undefined
  for (const url of [databaseUrl, str('admin-url')]) {
    if (url !== undefined && !/^postgres(ql)?:\/\//.test(url)) throw new UsageError('database URLs must start with postgres://')
  }
  return {
    duration: integer(str('duration'), 'duration', 10, 1, 600),
    warmup: integer(str('warmup'), 'warmup', 5, 0, 60),
    connections: integer(str('connections'), 'connections', 50, 1, 1000),
    ids: integer(str('ids'), 'ids', 10_000, 1, 10_000_000),
    store,
    databaseUrl,
    adminUrl: str('admin-url') ?? defaultAdminUrl,
  }
}
