import { z } from 'zod'
import { compileEntityTemplate, compileKeyTemplate, compilePathPattern, defaultKeyTemplate, isStorableText, maxEntityLength, keyHeaderOf, reservedPrefix } from './templates.js'
import { checkUpstreamTls, upstreamTlsSchema } from './upstream-tls.js'
import { checkMcpRules, mcpRefusals, mcpRuleSchema } from './mcp-schema.js'
import { duration, errorEnvelopes, headerName, integer, ruleName, size, upstream } from './fields.js'

// Framing, cookies and what only the gateway sets on a replay never come from the store.
const unreplayable = new Set(['connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'proxy-connection', 'te', 'trailer',
  'transfer-encoding', 'upgrade', 'host', 'content-length', 'set-cookie', 'set-cookie2', 'idempotent-replayed', 'x-request-id', 'idempotency-key'])

export const routeSchema = z.object({
  name: ruleName,
  method: z.string().transform((m) => m.toUpperCase()).pipe(z.enum(['GET', 'POST', 'PUT', 'PATCH', 'DELETE'])),
  path: z.string().superRefine((p, ctx) => {
    if (p === reservedPrefix.slice(0, -1) || p.startsWith(reservedPrefix)) ctx.addIssue({ code: 'custom', message: `${reservedPrefix} is reserved for fencegate itself` })
    try {
      compilePathPattern(p)
    } catch (e) {
      ctx.addIssue({ code: 'custom', message: (e as Error).message })
    }
  }),
  upstream,
  entity: z.string().optional().superRefine((t, ctx) => {
    if (t === undefined) return
    try {
      compileEntityTemplate(t)
    } catch (e) {
      ctx.addIssue({ code: 'custom', message: (e as Error).message })
    }
  }),
  fence: z.enum(['required', 'optional', 'off', 'lease']).default('required'),
  timeout_ms: integer(1, 600_000).default(10_000),
  idempotency: z.enum(['required', 'optional', 'off']).default('off'),
  /** Where a request names its operation: the entity grammar (`{body.idempotency_key}`, `report:{body.type}:{body.period}`). */
  idempotency_key: z.string().default(defaultKeyTemplate).superRefine((t, ctx) => {
    try {
      compileKeyTemplate(t)
    } catch (e) {
      ctx.addIssue({ code: 'custom', message: (e as Error).message })
    }
  }),
  /**
   * What a key names: `request`, the request it came with (another payload with it is
   * `idempotency_key_reused`), or `key`, the operation alone (a duplicate with another body
   * gets the first answer), for natural keys such as `report:{body.type}:{body.period}`.
   */
  idempotency_payload: z.enum(['request', 'key']).default('request'),
  idempotency_ttl: duration.pipe(z.number().min(1000, 'must be at least 1s').max(365 * 86_400_000, 'must be at most 365d')).default(86_400_000),
  idempotency_lock: duration.pipe(z.number().min(1, 'must be positive').max(86_400_000, 'must be at most 24h')).default(30_000),
  // Default: the route's timeout_ms (idempotencyWaitOf), so a duplicate outlasts its original and gets the one result.
  idempotency_wait: duration.pipe(z.number().max(60_000, 'must be at most 60s')).optional(),
  on_unknown_outcome: z.enum(['fail', 'retry']).default('fail'),
  /** The upstream de-duplicates Idempotency-Key itself (Stripe does): an unknown outcome is retried with the same key. */
  upstream_dedupes_keys: z.boolean().default(false),
  /**
   * The Idempotency-Key the upstream gets: the client's `as_sent`, or `tenant_scoped`: one of
   * fencegate's own per tenant and key (`fg1-` and a SHA-256), for an upstream whose one
   * credential serves every tenant, where two tenants' equal keys would be one operation.
   */
  upstream_key: z.enum(['as_sent', 'tenant_scoped']).default('as_sent'),
  /** A vendor header that states whether a refusal is worth retrying (`true`/`false`), e.g. Stripe-Should-Retry. */
  retry_hint_header: z.string().regex(headerName, 'expected a header name').optional(),
  /** The members every refusal of this route carries besides problem+json's, for the SDK its clients use. */
  error_envelope: z.enum(errorEnvelopes).default('stripe'),
  /** Upstream response headers stored and replayed beside the built-in allow-list, e.g. Request-Id. */
  replay_headers: z.array(z.string().regex(headerName, 'expected a header name').transform((h) => h.toLowerCase())
    .refine((h) => !unreplayable.has(h), 'this header is never replayed (hop-by-hop, Set-Cookie or fencegate\'s own)')).default([]),
  transient_statuses: z.array(z.number().int().min(100).max(599)).default([429, 503]),
  max_stored_body: size.default(1024 * 1024),
  scopes: z.array(z.string().regex(/^[\x21-\x7E]{1,128}$/, 'expected a scope such as payments:write')).default([]),
  claimed_tenant: z.string().regex(/^(body(\.[^.\s]+)+|header\.[A-Za-z0-9-]+)$/, 'expected body.a.b or header.Name').optional(),
  forward_authorization: z.boolean().default(false),
  ordering: z.enum(['none', 'serialize']).default('none'),
  ordering_wait: duration.pipe(z.number().max(60_000, 'must be at most 60s')).default(5000),
  upstream_headers: z.record(z.string().regex(headerName, 'expected a header name'), z.string().regex(/^[\t\x20-\x7E\x80-\xFF]*$/, 'expected a header value without control characters')).default({}),
  /** CA, client certificate and name for an https upstream; read at start, never stored as a rule. */
  upstream_tls: upstreamTlsSchema.optional(),
  /** Sign a Fence-Attestation for the upstream (src/attest.ts); needs the gateway's `attestation` section. */
  attest: z.boolean().default(false),
  /** An MCP endpoint: rules per JSON-RPC message (a tool of tools/call, or a method); other messages follow the route's own fields. */
  mcp: z.array(mcpRuleSchema).min(1).optional(),
  /**
   * How an MCP route answers a refused `tools/call`: a JSON-RPC error (`protocol_error`, its
   * `error.data.code` fencegate's code), or a tool result with `isError: true` and the code in
   * `structuredContent.code` (`tool_error`), which MCP advises for errors the model should act on.
   */
  mcp_refusals: mcpRefusals.default('protocol_error'),
}).strict().superRefine((r, ctx) => {
  checkMcpRules(r, ctx)
  if (!r.mcp && r.mcp_refusals !== 'protocol_error') ctx.addIssue({ code: 'custom', path: ['mcp_refusals'], message: 'applies to an MCP route only (one with mcp: rules)' })
  // An attestation says a fence check passed; on a route that checks none it would say nothing.
  if (typeof r.upstream?.origin === 'string') checkUpstreamTls(r.upstream_tls, r.upstream.origin, ctx)
  if (r.attest && r.fence === 'off') ctx.addIssue({ code: 'custom', path: ['attest'], message: 'attest needs a fence check: set fence to required, optional or lease' })
  if (r.idempotency !== 'off' && r.idempotency_lock <= r.timeout_ms) {
    ctx.addIssue({ code: 'custom', path: ['idempotency_lock'], message: `must exceed timeout_ms (${r.timeout_ms} ms): a lock that ends before the upstream answers would hand the key to a duplicate` })
  }
  if (r.fence === 'lease' && (r.entity === undefined || !/^job:\{[^{}]+\}$/.test(r.entity))) {
    ctx.addIssue({ code: 'custom', path: ['entity'], message: 'fence: lease needs an entity of the form job:{source.name}, e.g. job:{header.X-Job-Id}' })
  }
  if (r.fence !== 'off' && r.entity === undefined) {
    ctx.addIssue({ code: 'custom', path: ['entity'], message: `required when fence is ${r.fence}` })
  }
  // Only the cross-field checks are left once path and templates compiled on their own.
  let pattern, entity, key
  try {
    pattern = compilePathPattern(r.path)
    entity = r.entity === undefined ? undefined : compileEntityTemplate(r.entity)
    key = compileKeyTemplate(r.idempotency_key)
  } catch {
    return
  }
  for (const [field, template] of [['entity', entity], ['idempotency_key', key]] as const) {
    const missing = template?.params.find((p) => !pattern.params.includes(p))
    if (missing) ctx.addIssue({ code: 'custom', path: [field], message: `uses params.${missing}, which ${r.path} does not define` })
  }
  if (r.upstream_key === 'tenant_scoped' && keyHeaderOf(key) === undefined) {
    ctx.addIssue({ code: 'custom', path: ['upstream_key'], message: `tenant_scoped replaces the header the key is read from; idempotency_key ${r.idempotency_key} is not one header, and the body, path and query go upstream as sent` })
  }
})

/**
 * How long a duplicate waits for its in-flight original: the route's
 * `idempotency_wait`, else its `timeout_ms` (at most 60 s), so that it outlasts
 * the original. Resolved here rather than stored, so a rule records what was written.
 *
 * @example idempotencyWaitOf(parseConfig(file).routes[0]) // 10000 with the defaults
 */
export function idempotencyWaitOf(route: Pick<RouteConfig, 'idempotency_wait' | 'timeout_ms'>): number {
  return route.idempotency_wait ?? Math.min(route.timeout_ms, 60_000)
}

/**
 * An entity rule: overrides for every entity matching `entity_match`, where `*`
 * stands for any run of characters (`invoice:*`, `invoice:42`).
 */
export const entityRuleSchema = z.object({
  name: ruleName,
  entity_match: z.string().min(1).max(maxEntityLength).refine(isStorableText, 'expected text without control characters'),
  /** Only this tenant's entities; every tenant's when absent. */
  tenant: z.string().min(1).max(128).optional(),
  fence: z.enum(['required', 'optional', 'off']).optional(),
  frozen: z.boolean().default(false),
  ordering: z.enum(['none', 'serialize']).optional(),
}).strict().superRefine((r, ctx) => {
  if (!r.frozen && r.fence === undefined && r.ordering === undefined) {
    ctx.addIssue({ code: 'custom', message: 'an entity rule must set frozen, fence or ordering' })
  }
})

/**
 * The checks across routes, shared by the config file and the rules API:
 * unique names, no two routes matching one request, scopes and claimed
 * tenants only with authentication, `attest` only with a signing key.
 */
export function checkRouteSet(routes: RouteConfig[], authMode: 'none' | 'jwt', ctx: z.RefinementCtx, canAttest: boolean): void {
  const names = new Set<string>()
  const shapes = new Set<string>()
  routes.forEach((r, i) => {
    if (authMode === 'none' && (r.scopes.length > 0 || r.mcp?.some((m) => m.scopes?.length))) ctx.addIssue({ code: 'custom', path: ['routes', i, 'scopes'], message: 'scopes need auth.mode: jwt' })
    if (authMode === 'none' && r.claimed_tenant) ctx.addIssue({ code: 'custom', path: ['routes', i, 'claimed_tenant'], message: 'claimed_tenant needs auth.mode: jwt' })
    if (r.attest && !canAttest) ctx.addIssue({ code: 'custom', path: ['routes', i, 'attest'], message: "attest needs the gateway's attestation section (its signing key)" })
    if (names.has(r.name)) ctx.addIssue({ code: 'custom', path: ['routes', i, 'name'], message: `duplicate route name ${r.name}` })
    names.add(r.name)
    // An MCP route also serves its path's GET and DELETE (the session's stream and its end).
    for (const method of r.mcp ? [r.method, 'GET', 'DELETE'] : [r.method]) {
      const shape = `${method} ${r.path.replace(/:[^/]+/g, ':')}`
      if (shapes.has(shape)) ctx.addIssue({ code: 'custom', path: ['routes', i, 'path'], message: `another route already matches ${method} ${r.path}` })
      shapes.add(shape)
    }
  })
}

/** One validated entity rule. */
export type EntityRuleConfig = z.output<typeof entityRuleSchema>
/** One validated route. */
export type RouteConfig = z.output<typeof routeSchema>
