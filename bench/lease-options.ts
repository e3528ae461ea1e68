// The options of `npm run bench -- leases` (bench/leases.ts), parsed apart from the run so
// test/bench-leases.test.ts can check what each refuses.
import { parseArgs } from 'node:util'

export const systemNames = ['store', 'store-batch', 'http', 'http-jwt', 'http-batch', 'graphile', 'sdk', 'py-sdk', 'py-sdk-async'] as const
export type SystemName = (typeof systemNames)[number]
/** The worker SDKs' rows (bench/lease-sdk.ts) run one per `--slots`, and only when named: at 1 slot, a depth of 100,000 would take minutes. */
export const sdkSystemNames: readonly SystemName[] = ['sdk', 'py-sdk', 'py-sdk-async']
export const defaultSystems: readonly SystemName[] = systemNames.filter((n) => !sdkSystemNames.includes(n))

const flags = {
  depths: { type: 'string', help: 'queue depths to drain, comma-separated (default 1000,20000,100000)' },
  'steady-jobs': { type: 'string', help: 'jobs in the steady regime; 0 skips it (default 20000)' },
  rounds: { type: 'string', help: 'measured rounds; the table shows medians (default 3)' },
  concurrency: { type: 'string', help: 'jobs in flight at most, for every system (default 20)' },
  batch: { type: 'string', help: 'jobs per claim in the *-batch systems (default 10)' },
  producers: { type: 'string', help: 'producers in the steady regime (default 20)' },
  backlog: { type: 'string', help: 'jobs the steady producers keep waiting at most (default 200)' },
  systems: { type: 'string', help: `systems to run (default ${defaultSystems.join(',')}; also ${sdkSystemNames.join(',')})` },
  slots: { type: 'string', help: 'jobs at once in the SDK rows (sdk, py-sdk, py-sdk-async), a row each, comma-separated (default 1,8)' },
  baseline: { type: 'string', help: 'a git ref whose gateway runs http and http-jwt again, beside this build\'s, each round' },
  'admin-url': { type: 'string', help: 'where the fresh databases are created (default postgres://postgres@127.0.0.1:5432/test)' },
  help: { type: 'boolean', help: 'show this help' },
} as const

export function leaseUsage(): string {
  const lines = ['usage: npm run bench -- leases [options]', '', 'fencegate job claims side by side with graphile-worker, at several queue depths and steady.', '', 'options:']
  for (const [name, f] of Object.entries(flags)) lines.push(`  --${name}${f.type === 'string' ? ' <value>' : ''}`.padEnd(28) + f.help)
  lines.push('', 'a short check: npm run bench -- leases --depths 200,1000 --steady-jobs 500 --rounds 1')
  lines.push('a change\'s cost: npm run bench -- leases --systems http,http-jwt --baseline 4e10a66^')
  lines.push('the Python SDK beside the TS SDK: npm run bench -- leases --systems sdk,py-sdk,py-sdk-async --depths 2000 --steady-jobs 2000')
  return lines.join('\n')
}

function integer(value: unknown, name: string, fallback: number, min: number, max: number): number {
  if (value === undefined) return fallback
  if (typeof value !== 'string' || !/^\d+$/.test(value) || Number(value) < min || Number(value) > max) throw new Error(`--${name} must be an integer from ${min} to ${max}`)
  return Number(value)
}

export interface LeaseOptions {
  depths: number[]
  steadyJobs: number
  rounds: number
  concurrency: number
  batch: number
  producers: number
  backlog: number
  systems: SystemName[]
  /** The slots of each SDK row. */
  slots: number[]
  adminUrl: string | undefined
  /** A git ref (`4e10a66^`) whose build runs the systems of `baselineSystems` again. */
  baseline: string | undefined
}

/** The systems `--baseline` runs on the other build too: those that call the gateway one job per claim. */
export const baselineSystems: readonly SystemName[] = ['http', 'http-jwt']

export function parseLeaseOptions(argv: string[]): LeaseOptions | undefined {
  const { values } = parseArgs({ args: argv, options: Object.fromEntries(Object.entries(flags).map(([k, f]) => [k, { type: f.type }])), strict: true })
  if (values.help) return undefined
  const list = (v: unknown, fallback: string) => (typeof v === 'string' ? v : fallback).split(',').map((s) => s.trim()).filter((s) => s !== '')
  const systems = list(values.systems, defaultSystems.join(','))
  for (const s of systems) if (!(systemNames as readonly string[]).includes(s)) throw new Error(`--systems: unknown system ${JSON.stringify(s)} (known: ${systemNames.join(', ')})`)
  const selected = systemNames.filter((n) => systems.includes(n))
  const baseline = typeof values.baseline === 'string' ? values.baseline.trim() : undefined
  if (baseline !== undefined) {
    // A ref is handed to git; one that reads as an option or is empty would not name a commit.
    if (baseline === '' || baseline.startsWith('-')) throw new Error(`--baseline must be a git ref (a commit, branch or tag), not ${JSON.stringify(values.baseline)}`)
    if (!selected.some((n) => baselineSystems.includes(n))) throw new Error(`--baseline runs ${baselineSystems.join(' and ')} on the other build: --systems has neither`)
  }
  if (values.slots !== undefined && !selected.some((n) => sdkSystemNames.includes(n))) throw new Error(`--slots sets the SDK rows: --systems has none of ${sdkSystemNames.join(', ')}`)
  const slots = [...new Set(list(values.slots, '1,8').map((n) => integer(n, 'slots', 0, 1, 100)))]
  return {
    depths: list(values.depths, '1000,20000,100000').map((d) => integer(d, 'depths', 0, 1, 1_000_000)),
    steadyJobs: integer(values['steady-jobs'], 'steady-jobs', 20_000, 0, 1_000_000),
    rounds: integer(values.rounds, 'rounds', 3, 1, 10),
    concurrency: integer(values.concurrency, 'concurrency', 20, 1, 200),
    batch: integer(values.batch, 'batch', 10, 1, 100),
    producers: integer(values.producers, 'producers', 20, 1, 200),
    backlog: integer(values.backlog, 'backlog', 200, 1, 100_000),
    systems: selected,
    slots,
    adminUrl: typeof values['admin-url'] === 'string' ? values['admin-url'] : undefined,
    baseline,
  }
}
