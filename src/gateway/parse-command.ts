import type { BodyFields } from '../http/body-fields.js'
import type { Inbound } from '../http/inbound.js'
import { refuseFormMethodOverride } from '../http/method-override.js'
import { FencegateError } from '../http/problems.js'
import type { RuleSet } from '../rules/registry.js'
import type { IdempotencyClaim } from '../store/store.js'
import { checkClaimedTenant, commandPolicy, entityOf, entitySources, refuseAmbiguousHeaders, type CommandPolicy } from './command.js'
import type { PipelineContext } from './context.js'
import { fenceHeader, parseFence } from './fence.js'
import { keyFingerprint, payloadFingerprint } from './idempotency.js'
import { keyLabel, readKey } from './key.js'
import { resolveEntity } from './route.js'
import type { Trace } from './trace.js'

/** The request as the command parser reads it: its headers, its URL, the route's params and the body's bytes. */
export interface CommandInput {
  request: Inbound
  url: URL
  params: Record<string, string>
  bytes: Uint8Array
  /** The body's one reading, when a step before (the MCP seam) has taken it already. */
  fields?: BodyFields | undefined
  /** What of the body names the operation for a key's fingerprint, when not all of it (an MCP message without its id and _meta). */
  payload?: Uint8Array | undefined
}

/** The entity, on a route whose entity reads a header (it is then part of the key's fingerprint). */
function headerEntityOf(route: NonNullable<Trace['route']>, sources: ReturnType<typeof entitySources>, resolved: string | undefined): string | undefined {
  if (!route.entity?.parts.some((p) => 'source' in p && p.source === 'header')) return undefined
  return resolved ?? entityOf(route, sources) ?? ''
}

/**
 * Parses the fence and the key and resolves the entity (recording each on the trace);
 * returns the key's claim, or null when the request carries no key.
 */
export async function parseCommand(ctx: Pick<PipelineContext, 'digest'>, input: CommandInput, trace: Trace, rules: RuleSet): Promise<IdempotencyClaim | null> {
  const { request, url, params, bytes } = input
  const route = trace.route!
  const rc = route.config
  refuseAmbiguousHeaders(route, request.headers)
  const sources = entitySources(request, url, params, bytes, input.fields)
  // The body's one reading comes first, whatever the policy then reads of it: an unreadable body is refused, never read as silent.
  if (route.readsBody) sources.body()
  else refuseFormMethodOverride(request.headers, bytes)
  trace.auditEntity = () => entityOf(route, sources)
  let policy: CommandPolicy
  try {
    policy = commandPolicy(route, trace.identity!.tenant, sources, rules)
  } catch (err) {
    // A frozen entity: its audit row names it.
    if (err instanceof FencegateError && err.code === 'entity_frozen') trace.entity = String(err.extras.entity)
    throw err
  }
  trace.ordering = policy.ordering
  if (policy.fence !== 'off') {
    trace.fence = parseFence(request.headers.get(fenceHeader))
    if (trace.fence === undefined && (policy.fence === 'required' || policy.fence === 'lease')) throw new FencegateError('fence_required', `route ${rc.name} requires X-Execution-Fence`)
  }
  if (rc.idempotency !== 'off') {
    const read = readKey(route, sources)
    if ('key' in read) trace.key = read.key
    else if (rc.idempotency === 'required') throw new FencegateError('idempotency_key_required', `route ${rc.name} requires ${keyLabel(route, read.missing)}`)
  }
  if (rc.claimed_tenant) checkClaimedTenant(rc.claimed_tenant, sources, trace.identity!)
  if (trace.fence !== undefined) trace.entity = policy.entity ?? resolveEntity(route.entity!, sources)
  if (trace.key === undefined) return null
  trace.keySha256 = await ctx.digest(new TextEncoder().encode(trace.key))
  // One upstream operation per tenant and key: tenants' equal keys never meet at a shared upstream account.
  if (rc.upstream_key === 'tenant_scoped') trace.upstreamKey = `fg1-${await ctx.digest(new TextEncoder().encode(`${trace.identity!.tenant}\n${trace.key}`))}`
  return {
    key: trace.key,
    fingerprint: rc.idempotency_payload === 'key'
      ? await keyFingerprint(request.method, rc.name, trace.entity ?? entityOf(route, sources), ctx.digest)
      : await payloadFingerprint(request.method, rc.name, url.pathname, url.search, input.payload ? await ctx.digest(input.payload) : trace.bodySha256 ?? await ctx.digest(bytes), ctx.digest, headerEntityOf(route, sources, trace.entity)),
    ownerToken: crypto.randomUUID(),
    lockMs: rc.idempotency_lock,
    ttlMs: rc.idempotency_ttl,
    retryUnknown: rc.on_unknown_outcome === 'retry' || rc.upstream_dedupes_keys,
  }
}
