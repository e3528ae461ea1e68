import { z } from 'zod'
import { compileEntityTemplate, compileKeyTemplate, compilePathPattern } from './templates.js'

/**
 * The rules of an MCP route (`mcp:`): one per JSON-RPC message kind the route decides on, a
 * tool of `tools/call` (matched on `params.name`) or another method (`tasks/cancel`). A rule
 * names only what it decides (entity, fence, key, scopes); everything else (upstream,
 * timeouts, lock, TTL, envelope, transient statuses...) is the route's. A field a rule leaves
 * out is the route's too, except `scopes`, which add to the route's: a tool never needs less
 * than the endpoint it is reached through.
 */

const template = (compile: (t: string) => unknown) => z.string().superRefine((t, ctx) => {
  try {
    compile(t)
  } catch (e) {
    ctx.addIssue({ code: 'custom', message: (e as Error).message })
  }
})

// A tool or method name as MCP writes them (`create_ticket`, `tasks/cancel`, `github.search`).
const messageName = z.string().regex(/^[A-Za-z0-9_][A-Za-z0-9_./:-]{0,127}$/, 'expected 1-128 letters, digits, _ . / : -')

/** How a refused `tools/call` is answered: a JSON-RPC error, or a tool result with `isError: true`. */
export const mcpRefusals = z.enum(['protocol_error', 'tool_error'])

export const mcpRuleSchema = z.object({
  tool: messageName.optional(),
  method: messageName.optional(),
  entity: template(compileEntityTemplate).optional(),
  fence: z.enum(['required', 'optional', 'off']).optional(),
  idempotency: z.enum(['required', 'optional', 'off']).optional(),
  idempotency_key: template(compileKeyTemplate).optional(),
  idempotency_payload: z.enum(['request', 'key']).optional(),
  scopes: z.array(z.string().regex(/^[\x21-\x7E]{1,128}$/, 'expected a scope such as payments:write')).optional(),
  mcp_refusals: mcpRefusals.optional(),
  /**
   * A tool argument that carries the fence (`params.arguments.<name>`), for tools whose schema
   * takes the fence as an argument; on 2026-07-28 the 2.x client mirrors an argument declared
   * with `"x-mcp-header": "Fence"` as `Mcp-Param-Fence`, which must then agree with it.
   */
  fence_argument: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, 'expected an argument name (letters, digits, _ and -)').optional(),
}).strict().superRefine((r, ctx) => {
  if (r.method !== undefined && r.fence_argument !== undefined) ctx.addIssue({ code: 'custom', path: ['fence_argument'], message: 'a tool argument exists on a tool\'s rule only' })
  // Only tools/call has a result that can say isError; other methods' refusals are JSON-RPC errors.
  if (r.method !== undefined && r.mcp_refusals === 'tool_error') ctx.addIssue({ code: 'custom', path: ['mcp_refusals'], message: 'tool_error answers a tool\'s refusal; a method rule\'s refusals are JSON-RPC errors' })
  if ((r.tool === undefined) === (r.method === undefined)) ctx.addIssue({ code: 'custom', message: 'a rule names exactly one of tool or method' })
  // A tool's rule is matched on params.name; a method rule for tools/call would shadow every tool's.
  if (r.method === 'tools/call') ctx.addIssue({ code: 'custom', path: ['method'], message: 'tools/call is matched per tool: write tool: <name>' })
})

/** One validated MCP rule. */
export type McpRuleConfig = z.output<typeof mcpRuleSchema>

/**
 * The route configuration a message under `rule` is decided by: the route's, with the rule's
 * fields over it, named `<route>/<tool or method>` (audit rows, metrics, logs and spans carry
 * that name, and a key's fingerprint has it, so one key never replays across tools).
 *
 * @example
 * mcpRuleConfig(route, { tool: 'create_ticket', fence: 'required' }).name // 'tickets-mcp/create_ticket'
 */
export function mcpRuleConfig<R extends { name: string; scopes: string[] }>(route: R, rule: McpRuleConfig): R {
  const defined = <K extends keyof McpRuleConfig>(k: K) => (rule[k] === undefined ? {} : { [k]: rule[k] })
  return {
    ...route,
    ...defined('entity'), ...defined('fence'), ...defined('idempotency'), ...defined('idempotency_key'), ...defined('idempotency_payload'), ...defined('mcp_refusals'),
    name: `${route.name}/${rule.tool ?? rule.method}`,
    scopes: [...new Set([...route.scopes, ...(rule.scopes ?? [])])],
    mcp: undefined,
  }
}

/**
 * The checks of a route's `mcp` list: a POST route, each message kind once, and each rule's
 * effective fields consistent as a route's are (a fence needs an entity; a key's lock outlasts
 * the timeout).
 */
export function checkMcpRules(r: { method: string; path: string; name: string; scopes: string[]; entity?: string | undefined; fence: string; idempotency: string; idempotency_lock: number; timeout_ms: number; mcp?: McpRuleConfig[] | undefined }, ctx: z.RefinementCtx): void {
  if (!r.mcp) return
  let pathParams: string[]
  try {
    pathParams = compilePathPattern(r.path).params
  } catch {
    return
  }
  if (r.method !== 'POST') ctx.addIssue({ code: 'custom', path: ['method'], message: 'an MCP route is POST (its GET and DELETE are served as pass-through)' })
  const seen = new Set<string>()
  r.mcp.forEach((rule, i) => {
    const what = rule.tool !== undefined ? `tool ${rule.tool}` : `method ${rule.method}`
    if (seen.has(what)) ctx.addIssue({ code: 'custom', path: ['mcp', i], message: `another rule already names ${what}` })
    seen.add(what)
    const fence = rule.fence ?? r.fence
    if (fence !== 'off' && (rule.entity ?? r.entity) === undefined) ctx.addIssue({ code: 'custom', path: ['mcp', i, 'entity'], message: `required when fence is ${fence}` })
    if ((rule.idempotency ?? r.idempotency) !== 'off' && r.idempotency_lock <= r.timeout_ms) {
      ctx.addIssue({ code: 'custom', path: ['mcp', i, 'idempotency'], message: `needs the route's idempotency_lock to exceed its timeout_ms (${r.timeout_ms} ms)` })
    }
    for (const field of ['entity', 'idempotency_key'] as const) {
      const missing = paramsOf(rule[field], field).find((p) => !pathParams.includes(p))
      if (missing) ctx.addIssue({ code: 'custom', path: ['mcp', i, field], message: `uses params.${missing}, which ${r.path} does not define (the message is read as {body.params...})` })
    }
  })
}

function paramsOf(t: string | undefined, field: 'entity' | 'idempotency_key'): string[] {
  if (t === undefined) return []
  try {
    return (field === 'entity' ? compileEntityTemplate(t) : compileKeyTemplate(t)).params
  } catch {
    return []
  }
}
