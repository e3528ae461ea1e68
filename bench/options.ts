import { parseArgs } from 'node:util'

export interface BenchOptions {
  duration: number
  warmup: number
  connections: number
  ids: number
  /** Times the whole scenario set runs, one pass after the other, on the same gateway. */
  passes: number
  /** Completed keys the replay scenario creates, then replays. */
  replayKeys: number
  /** Scenarios to run (passthrough always runs: it is the baseline). */
  scenarios: ScenarioName[]
  /** Node options for the gateway process; `recommendedGatewayNodeOptions` unless given. */
  gatewayNodeOptions: string[]
  /** A file that gets all of the gateway's output (e.g. --trace-gc lines). */
  gatewayLog: string | undefined
  store: 'postgres' | 'pglite'
  /** Used as the store as-is (migrated, never dropped). */
  databaseUrl: string | undefined
  /** Where a throwaway database is created when no databaseUrl is given. */
  adminUrl: string
}

export const scenarioNames = ['passthrough', 'spread', 'raise', 'hot', 'idem-spread', 'replay', 'idem-hot'] as const
export type ScenarioName = (typeof scenarioNames)[number]

/**
 * The deployment recommendation in docs/benchmarks.md ("Memory"), which the bench applies to
 * the gateway unless told otherwise: it caps V8's old generation, which also makes V8 grow
 * it by ~1.6x the live heap instead of ~4x on hosts with 16 GB or more.
 */
export const recommendedGatewayNodeOptions = ['--max-old-space-size=1024']

export const defaultAdminUrl = 'postgres://postgres@127.0.0.1:5432/test'

const flags = {
  duration: { type: 'string', help: 'measured seconds per scenario (default 10)' },
  warmup: { type: 'string', help: 'warm-up seconds per scenario, discarded (default 3)' },
  connections: { type: 'string', help: 'concurrent HTTP connections (default 50)' },
  ids: { type: 'string', help: 'invoice ids the spread scenarios draw from (default 10000)' },
  passes: { type: 'string', help: 'times the scenario set runs on the same gateway, to compare memory (default 2)' },
  'replay-keys': { type: 'string', help: 'completed keys the replay scenario creates and replays (default 1000)' },
  scenarios: { type: 'string', help: `comma-separated subset of ${scenarioNames.join(',')} (default all)` },
  'gateway-node-options': { type: 'string', help: `node options for the gateway, space-separated; write --gateway-node-options=... (default ${recommendedGatewayNodeOptions.join(' ')}; = alone for none)` },
  'gateway-log': { type: 'string', help: "append the gateway's stdout and stderr to this file" },
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
    'passthrough, fenced and idempotent forwarding in one run, and the gateway\'s memory.',
    '',
    'options:',
  ]
  for (const [name, f] of Object.entries(flags)) lines.push(`  --${name}${f.type === 'string' ? ' <value>' : ''}`.padEnd(34) + f.help)
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
  const scenarios = (str('scenarios') ?? scenarioNames.join(',')).split(',').map((n) => n.trim()).filter((n) => n !== '')
  for (const n of scenarios) {
    if (!(scenarioNames as readonly string[]).includes(n)) throw new UsageError(`--scenarios: unknown scenario ${JSON.stringify(n)} (known: ${scenarioNames.join(', ')})`)
  }
  const given = str('gateway-node-options')
  const gatewayNodeOptions = given === undefined ? [...recommendedGatewayNodeOptions] : given.split(/\s+/).filter((o) => o !== '')
  for (const o of gatewayNodeOptions) {
    if (!o.startsWith('--')) throw new UsageError(`--gateway-node-options takes node flags such as --max-semi-space-size=4, got ${JSON.stringify(o)}`)
  }
  return {
    duration: integer(str('duration'), 'duration', 10, 1, 600),
    warmup: integer(str('warmup'), 'warmup', 3, 0, 60),
    connections: integer(str('connections'), 'connections', 50, 1, 1000),
    ids: integer(str('ids'), 'ids', 10_000, 1, 10_000_000),
    passes: integer(str('passes'), 'passes', 2, 1, 5),
    replayKeys: integer(str('replay-keys'), 'replay-keys', 1000, 1, 100_000),
    // Always in the canonical order, passthrough first.
    scenarios: scenarioNames.filter((n) => n === 'passthrough' || scenarios.includes(n)),
    gatewayNodeOptions,
    gatewayLog: str('gateway-log'),
    store,
    databaseUrl,
    adminUrl: str('admin-url') ?? defaultAdminUrl,
  }
}
