import type { Config } from '../config/schema.js'
import type { Identity } from '../http/identity.js'
import type { RpcId } from '../http/jsonrpc.js'
import type { ProblemCode } from '../http/problems.js'
import type { Logger } from '../observe/log.js'
import type { Metrics, RequestOutcome } from '../observe/metrics.js'
import type { OpenSpan, Tracing } from '../observe/tracing.js'
import type { Route } from './route.js'
import { endRequestSpan } from './spans.js'

/** What the pipeline learned about a request; logged once per decision, never with a body. */
export interface Trace {
  requestId: string
  method: string
  path: string
  route?: Route
  identity?: Identity
  entity?: string
  /** The route's entity as far as the request resolves it, for audit rows of refusals decided before the fence. */
  auditEntity?: () => string | undefined
  fence?: string
  key?: string
  keySha256?: string
  /** The Idempotency-Key sent upstream on a `upstream_key: tenant_scoped` route. */
  upstreamKey?: string
  bodySha256?: string | null
  ruleVersion?: number
  /** The delivery order the route or an entity rule asks for. */
  ordering?: 'none' | 'serialize'
  /** Milliseconds spent in store statements and in the forward step, for the decision's log line. */
  storeMs?: number
  upstreamMs?: number
  /** The request's SERVER span (a no-op one when tracing is off); ended with the decision. */
  span?: OpenSpan
  /** What the store decided about the Idempotency-Key, when one was presented (`reserved`, `replay`, `in_progress`...). */
  idempotencyOutcome?: string
  /** An MCP message (src/gateway/mcp.ts): its JSON-RPC id (undefined for a notification), method and tool. */
  rpc?: { id: RpcId | undefined; method?: string | undefined; name?: string | undefined }
}

/** Runs a step, adding its duration to the trace's store or upstream time, whether it succeeds or throws. */
export async function timed<T>(trace: Trace, into: 'storeMs' | 'upstreamMs', step: () => Promise<T>): Promise<T> {
  const started = performance.now()
  try {
    return await step()
  } finally {
    addElapsed(trace, into, started)
  }
}

/**
 * Adds the time since `started` (a `performance.now()`) to the trace's store or upstream time:
 * what `timed` does, for a hot step that times itself in a `finally` rather than pay its
 * closure and async frame on every command.
 *
 * @example
 * const started = performance.now()
 * try { r = await ctx.store.reserve(command) } finally { addElapsed(trace, 'storeMs', started) }
 */
export function addElapsed(trace: Trace, into: 'storeMs' | 'upstreamMs', started: number): void {
  trace[into] = (trace[into] ?? 0) + performance.now() - started
}

function roundMs(ms: number | undefined): number | undefined {
  return ms === undefined ? undefined : Math.round(ms * 100) / 100
}

/** The decision's one log line and its metrics: identifiers, hashes and durations, never a body. */
export function logDecision(ctx: { log: Logger; metrics: Metrics; tracing: Tracing; config: Config }, trace: Trace, outcome: RequestOutcome, status: number, started: number, code?: ProblemCode): void {
  const durationMs = performance.now() - started
  const route = trace.route?.config.name
  ctx.metrics.request({ route, outcome, code, durationMs })
  if (route !== undefined && trace.upstreamMs !== undefined) ctx.metrics.upstream({ route, durationMs: trace.upstreamMs })
  ctx.log.info('request', {
    request_id: trace.requestId, route, method: trace.method, tenant: trace.identity?.tenant,
    mcp_method: trace.rpc?.method, mcp_tool: trace.rpc?.name,
    entity: trace.entity, fence: trace.fence, key_sha256: trace.keySha256, rule_version: trace.ruleVersion, outcome, code, status,
    duration_ms: roundMs(durationMs), store_ms: roundMs(trace.storeMs), upstream_ms: roundMs(trace.upstreamMs),
  })
  // An unsampled span records nothing: its attributes are not even built.
  if (trace.span?.sampled) endRequestSpan(trace, code ?? (outcome === 'rejected' ? 'internal_error' : outcome), status, code, ctx.config.telemetry.entity)
}
