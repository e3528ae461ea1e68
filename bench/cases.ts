import type { BenchOptions, CaseName } from './run-options.js'
import type { SystemName } from './systems.js'
import type { Traffic } from './traffic.js'

/**
 * A case's name; `fg-spread×2` is fg-spread on the gateway with `--workers 2`, `fg-spread+traces`
 * on the one with `--traces`, `fg-spread+pglite` on the one on the embedded store (`--store pglite`).
 */
export type CaseId = CaseName | `${CaseName}×${number}` | `${CaseName}+traces` | `${CaseName}+pglite`

export interface Case {
  name: CaseId
  label: string
  system: SystemName
  traffic: Pick<Traffic, 'path' | 'entity' | 'key'> & { raise?: boolean }
  /** The hand-rolled case this one is compared with: the same kind of work done by hand. */
  hand: CaseName
  /** The case whose p99 bounds this one's (fencegate cases only): at most twice it. */
  p99Of?: CaseName
  /** The system the proxy forwards to when it is not the bench's upstream (the MCP server): its CPU is the run's upstream CPU. */
  upstream?: SystemName
  /** For a case on the multi-worker gateway: the same case on the one-worker gateway. */
  single?: CaseName
  /** For a case on the tracing gateway (`--traces`): the same case on the gateway that does not trace. */
  untraced?: CaseName
  /** For a case on the embedded store's gateway (`--store pglite`): the same case on PostgreSQL. */
  onPostgres?: CaseName
  /**
   * A path on which every entity is presented the run's fence once before priming
   * (bench/prepare.ts `seedEntities`), so spread cases measure the steady state.
   */
  seedPath?: string
}

const pay = '/payments/{id}/capture'
const once = '/idempotent/payments/{id}/capture'

export const cases: readonly Case[] = [
  { name: 'nginx-proxy', label: 'nginx `proxy_pass`, 1 worker', system: 'nginx', traffic: { path: pay, entity: 'spread', key: 'none' }, hand: 'hand-fence' },
  { name: 'bare-node', label: 'bare Node proxy (node:http + undici Pool)', system: 'bare', traffic: { path: pay, entity: 'spread', key: 'none' }, hand: 'hand-fence' },
  { name: 'hand-fence', label: 'hand-rolled fence (postgres.js upsert, forward)', system: 'hand', traffic: { path: pay, entity: 'spread', key: 'none' }, hand: 'hand-fence', seedPath: pay },
  { name: 'hand-hot', label: 'hand-rolled fence, one hot entity', system: 'hand', traffic: { path: pay, entity: 'hot', key: 'none' }, hand: 'hand-fence' },
  { name: 'hand-key', label: 'hand-rolled fence + key (2 statements, answer stored)', system: 'hand', traffic: { path: pay, entity: 'spread', key: 'new' }, hand: 'hand-fence', seedPath: pay },
  { name: 'fg-off', label: 'fencegate `fence: off`', system: 'gateway', traffic: { path: '/passthrough/{id}/capture', entity: 'spread', key: 'none' }, hand: 'hand-fence', p99Of: 'bare-node' },
  { name: 'fg-spread', label: 'fencegate fenced, spread entities', system: 'gateway', traffic: { path: pay, entity: 'spread', key: 'none' }, hand: 'hand-fence', p99Of: 'hand-fence', seedPath: pay },
  { name: 'fg-hot', label: 'fencegate fenced, one hot entity', system: 'gateway', traffic: { path: pay, entity: 'hot', key: 'none' }, hand: 'hand-hot', p99Of: 'hand-hot' },
  { name: 'fg-key', label: 'fencegate new `Idempotency-Key`', system: 'gateway', traffic: { path: once, entity: 'spread', key: 'new' }, hand: 'hand-key', p99Of: 'hand-key', seedPath: pay },
  // The key in the JSON body (`idempotency_key: "{body.idempotency_key}"`, Square's convention):
  // beside fg-key it shows what reading the key from the body costs over the header.
  { name: 'fg-key-body', label: 'fencegate new key in the body (`{body.idempotency_key}`)', system: 'gateway', traffic: { path: '/bodykey/payments/{id}/capture', entity: 'spread', key: 'body' }, hand: 'hand-key', p99Of: 'fg-key', seedPath: pay },
  // Every request raises its entity's fence (entities invoice:r<id>, apart from spread's), so the
  // reserve statement also writes a fence history row: beside fg-spread (equal fences, no row)
  // it shows what the history costs.
  { name: 'fg-raise', label: 'fencegate fenced, a raise on every request (fence history)', system: 'gateway', traffic: { path: '/payments/r{id}/capture', entity: 'spread', key: 'none', raise: true }, hand: 'hand-fence', p99Of: 'hand-fence' },
  { name: 'fg-replay', label: 'fencegate replay (no upstream call)', system: 'gateway', traffic: { path: once, entity: 'spread', key: 'replay' }, hand: 'hand-fence', p99Of: 'hand-fence' },
  // Issue 42: an agent's `tools/call` (JSON-RPC, fence and a new key in `_meta`) straight to an
  // MCP server built with the official SDK, and the same calls through fencegate's MCP route,
  // whose rule fences invoice:<id> (the entities fg-key uses, seeded the same way) and requires
  // the key. In mcp-direct the MCP server is what answers, so its CPU is the proxy column.
  { name: 'mcp-direct', label: 'MCP server (official 2.x SDK, JSON answers) straight, its own CPU', system: 'mcp', traffic: { path: '/mcp', entity: 'spread', key: 'meta' }, hand: 'hand-key' },
  { name: 'fg-mcp', label: 'fencegate MCP route: fenced `tools/call`, new key in `_meta`', system: 'gateway', upstream: 'mcp', traffic: { path: '/mcp', entity: 'spread', key: 'meta' }, hand: 'hand-key', p99Of: 'mcp-direct', seedPath: pay },
  // The same calls to the same MCP server through a plain REST route with a key (entity from the
  // path, fence and key in headers): fg-key's work at fg-mcp's load and upstream, so that beside
  // fg-mcp it shows what reading the message as MCP costs, apart from what the MCP server's CPU
  // on the same two cores does to the gateway's batching.
  { name: 'fg-mcp-rest', label: 'the same `tools/call` through a REST route with a key (headers)', system: 'gateway', upstream: 'mcp', traffic: { path: '/rest-mcp/{id}', entity: 'spread', key: 'meta-rest' }, hand: 'hand-key', seedPath: pay },
  // The same MCP route and calls, answered by the bench's own upstream instead of the MCP server:
  // what the gateway's MCP route costs per call when no MCP server shares the two cores, on the
  // upstream fg-key has, so that its gateway CPU compares with fg-key's like for like.
  { name: 'fg-mcp-upstream', label: 'the same MCP route and calls, answered by the bench upstream (no MCP server on the cores)', system: 'gateway', traffic: { path: '/mcp-upstream', entity: 'spread', key: 'meta' }, hand: 'hand-key', p99Of: 'fg-key', seedPath: pay },
]

export const caseNamed = (name: CaseName): Case => cases.find((c) => c.name === name)!

/**
 * The cases to run: `selected`, and with `workers` > 1 each fencegate case again right after
 * itself on the gateway that runs `server.workers: workers`, so both see the same minutes.
 */
export function withWorkers(selected: readonly Case[], workers: number): Case[] {
  if (workers <= 1) return [...selected]
  return selected.flatMap((c) => c.system !== 'gateway' ? [c] : [c, {
    ...c, name: `${c.name as CaseName}×${workers}` as CaseId, label: `${c.label}, ${workers} workers`, system: 'gateway-workers' as const,
    p99Of: undefined, single: c.name as CaseName,
  }])
}

/**
 * With `--traces <ratio>`: each one-worker fencegate case again right after itself on the
 * gateway that traces at that ratio, so both see the same minutes and the ratio of the two is
 * what tracing costs.
 */
export function withTraces(selected: readonly Case[], ratio: number | undefined): Case[] {
  if (ratio === undefined) return [...selected]
  return selected.flatMap((c) => c.system !== 'gateway' ? [c] : [c, {
    ...c, name: `${c.name as CaseName}+traces` as CaseId, label: `${c.label}, traced at ${+(ratio * 100).toPrecision(3)}%`, system: 'gateway-traces' as const,
    p99Of: undefined, untraced: c.name as CaseName,
  }])
}

/**
 * With `--store pglite`: each one-worker fencegate case again right after itself on a gateway
 * on the embedded store (what `npm start` runs), so the ratio of the two, taken within a round,
 * is what a newcomer's first store costs against PostgreSQL.
 */
export function withEmbedded(selected: readonly Case[], embedded: boolean): Case[] {
  if (!embedded) return [...selected]
  return selected.flatMap((c) => c.system !== 'gateway' ? [c] : [c, {
    ...c, name: `${c.name as CaseName}+pglite` as CaseId, label: `${c.label}, embedded store (PGlite)`, system: 'gateway-pglite' as const,
    p99Of: undefined, onPostgres: c.name as CaseName,
  }])
}

/**
 * Builds each run's traffic: new keys unique per run, and one fence for the whole bench.
 * A fence raised per run made every case's first request per entity in each round a raise
 * (with its fence history row), so a spread case measured a mix of raises and repeats set
 * by its request rate; `fg-raise` measures raises on purpose.
 */
export function trafficFactory(options: BenchOptions): (c: Case) => Traffic {
  const fence = (BigInt(Date.now()) * 1000n).toString()
  const tag = `b${Date.now().toString(36)}`
  let run = 0
  return (c) => {
    run++
    const { raise, ...traffic } = c.traffic
    return {
      ...traffic, ...(raise ? { raiseBase: String(Date.now()) } : {}), ids: options.ids, replayKeys: options.replayKeys,
      keyPrefix: `${tag}.${run}.`, replayPrefix: `${tag}.r`, fence,
    }
  }
}
