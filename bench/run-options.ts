import { parseArgs } from 'node:util'
import { defaultMaxConnections } from '../src/config/schema.js'
import type { LoadGenerator } from './load.js'

export const caseNames = ['nginx-proxy', 'bare-node', 'hand-fence', 'hand-hot', 'hand-key', 'fg-off', 'fg-spread', 'fg-hot', 'fg-key', 'fg-key-body', 'fg-replay', 'fg-raise', 'mcp-direct', 'fg-mcp', 'fg-mcp-rest', 'fg-mcp-upstream'] as const
export type CaseName = (typeof caseNames)[number]

export interface BenchOptions {
  /** Interleaved rounds: every case once per round; the report takes the median over rounds. */
  rounds: number
  /** Measured seconds per case per round. */
  duration: number
  /** Discarded seconds of load before each measured run. */
  warmup: number
  /** Seconds of load per case in the priming pass before round 1, discarded. */
  prime: number
  connections: number
  ids: number
  /** Completed keys the replay case draws from. */
  replayKeys: number
  cases: CaseName[]
  load: LoadGenerator | undefined
  /** false: no nginx even when it is on PATH. */
  nginx: boolean
  /** Node flags for the gateway; none by default: what `npx fencegate serve` gets. */
  gatewayNodeOptions: string[]
  gatewayLog: string | undefined
  /** PostgreSQL connections of the gateway and of the hand-rolled fence. */
  pool: number
  /** The PostgreSQL server; the bench creates a fresh database on it and drops it at the end. */
  databaseUrl: string
  /** A label for the report, e.g. "noisy machine". */
  note: string | undefined
  /** > 1: every fencegate case also runs on a gateway with `server.workers` this many. */
  workers: number
  /** A sampling ratio: every fencegate case also runs on a gateway tracing at it (OTLP to a sink); undefined: not. */
  traces: number | undefined
  /** `--store pglite`: every fencegate case also runs on a gateway on the embedded store. */
  embedded: boolean
}

export const defaultDatabaseUrl = 'postgres://postgres@127.0.0.1:5432/test'

const flags = {
  rounds: { type: 'string', help: 'interleaved rounds; medians are over rounds (default 3)' },
  duration: { type: 'string', help: 'measured seconds per case per round (default 10)' },
  warmup: { type: 'string', help: 'discarded seconds of load before each measured run (default 2)' },
  prime: { type: 'string', help: 'seconds per case of the discarded priming pass before round 1 (default 5)' },
  quick: { type: 'boolean', help: 'a check that it works: --rounds 1 --duration 3 --warmup 1 --prime 2 unless given' },
  connections: { type: 'string', help: 'concurrent connections (default 50)' },
  ids: { type: 'string', help: 'invoice ids the spread cases draw from (default 10000)' },
  'replay-keys': { type: 'string', help: 'completed keys the replay case draws from (default 1000)' },
  cases: { type: 'string', help: `comma-separated subset of: ${caseNames.join(', ')}` },
  load: { type: 'string', help: 'wrk or autocannon (default: wrk when on PATH)' },
  'no-nginx': { type: 'boolean', help: 'skip nginx even when it is on PATH (a Node upstream then)' },
  'gateway-node-options': { type: 'string', help: 'node flags for the gateway (default none); write it with =' },
  'gateway-log': { type: 'string', help: 'a file that gets all of the gateway\'s output' },
  pool: { type: 'string', help: `PostgreSQL connections of the gateway (store.max_connections) and of the hand-rolled fence (default ${defaultMaxConnections}, the gateway's default)` },
  'database-url': { type: 'string', help: `PostgreSQL server for the fresh database (default $DATABASE_URL or ${defaultDatabaseUrl})` },
  note: { type: 'string', help: 'a label printed with the results, e.g. "noisy machine"' },
  workers: { type: 'string', help: 'also run every fencegate case on a gateway with this many workers (server.workers), beside the 1-worker one (default 1: not)' },
  traces: { type: 'string', help: 'also run every fencegate case on a gateway tracing at this sampling ratio (0 to 1, e.g. 1 or 0.01), exporting OTLP to a sink' },
  store: { type: 'string', help: 'pglite: also run every fencegate case on a gateway on the embedded store (PGlite, as `npm start` runs), beside PostgreSQL in the same rounds' },
  help: { type: 'boolean', help: 'this help' },
} as const

export function usage(): string {
  const lines = [
    'usage: npm run bench -- [options]            fencegate beside reference systems, in one run',
    '       npm run bench -- profile [options]    CPU profiles of the gateway (see bench/profile.ts)',
    '       npm run bench -- leases [options]     the lease service\'s own bench',
    '       npm run bench -- faults               store faults and failover on a throwaway cluster',
    '       npm run bench -- positions            the cost of tracking acknowledged WAL positions',
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

/** A sampling ratio from 0 to 1, as OTEL_TRACES_SAMPLER_ARG takes it. */
function ratio(value: string | undefined, name: string): number | undefined {
  if (value === undefined) return undefined
  if (!/^(?:0|1|0?\.\d+|[01]\.\d*)$/.test(value) || Number(value) > 1) {
    throw new UsageError(`--${name} must be a sampling ratio from 0 to 1 (e.g. 1 or 0.01), got ${JSON.stringify(value)}`)
  }
  return Number(value)
}

/** Parses argv; returns undefined when --help was asked for. */
export function parseOptions(argv: string[], env: NodeJS.ProcessEnv, defaults: Partial<Record<'cases', CaseName[]>> = {}): BenchOptions | undefined {
  let values
  try {
    const options = Object.fromEntries(Object.entries(flags).map(([k, f]) => [k, { type: f.type }]))
    values = parseArgs({ args: argv, options, strict: true, allowPositionals: false }).values as Record<string, string | boolean | undefined>
  } catch (err) {
    throw new UsageError((err as Error).message)
  }
  if (values.help) return undefined
  const str = (name: string) => (typeof values[name] === 'string' ? (values[name] as string) : undefined)
  const quick = values.quick === true
  const databaseUrl = str('database-url') || env.DATABASE_URL || defaultDatabaseUrl
  if (!/^postgres(ql)?:\/\//.test(databaseUrl)) throw new UsageError('--database-url must start with postgres://')
  const given = str('cases')?.split(',').map((n) => n.trim()).filter((n) => n !== '')
  for (const n of given ?? []) {
    if (!(caseNames as readonly string[]).includes(n)) throw new UsageError(`--cases: unknown case ${JSON.stringify(n)} (known: ${caseNames.join(', ')})`)
  }
  const load = str('load')
  const store = str('store')
  if (store !== undefined && store !== 'pglite') throw new UsageError(`--store takes pglite (PostgreSQL always runs), got ${JSON.stringify(store)}`)
  if (load !== undefined && load !== 'wrk' && load !== 'autocannon') throw new UsageError(`--load must be wrk or autocannon, got ${JSON.stringify(load)}`)
  const nodeOptions = (str('gateway-node-options') ?? '').split(/\s+/).filter((o) => o !== '')
  for (const o of nodeOptions) {
    if (!o.startsWith('--')) throw new UsageError(`--gateway-node-options takes node flags such as --max-old-space-size=512, got ${JSON.stringify(o)}`)
  }
  return {
    rounds: integer(str('rounds'), 'rounds', quick ? 1 : 3, 1, 20),
    duration: integer(str('duration'), 'duration', quick ? 3 : 10, 1, 600),
    warmup: integer(str('warmup'), 'warmup', quick ? 1 : 2, 0, 60),
    prime: integer(str('prime'), 'prime', quick ? 2 : 5, 0, 120),
    connections: integer(str('connections'), 'connections', 50, 1, 1000),
    ids: integer(str('ids'), 'ids', 10_000, 1, 10_000_000),
    replayKeys: integer(str('replay-keys'), 'replay-keys', 1000, 1, 100_000),
    // Always in the canonical order.
    cases: caseNames.filter((n) => (given ?? defaults.cases ?? caseNames).includes(n)),
    load,
    nginx: values['no-nginx'] !== true,
    gatewayNodeOptions: nodeOptions,
    gatewayLog: str('gateway-log'),
    pool: integer(str('pool'), 'pool', defaultMaxConnections, 1, 100),
    databaseUrl,
    note: str('note'),
    workers: integer(str('workers'), 'workers', 1, 1, 64),
    traces: ratio(str('traces'), 'traces'),
    embedded: store === 'pglite',
  }
}
