import type { BodyFields } from '../http/body-fields.js'
import type { HeaderView } from '../http/exchange.js'
import { FencegateError } from '../http/problems.js'
import { mcpRuleConfig, type RouteConfig } from '../config/schema.js'
import { compileEntityTemplate, compileKeyTemplate, compilePathPattern, isStorableText, keyHeaderOf, maxEntityLength, partValue, type EntityTemplate, type PathPattern, type Segment, type TemplatePart } from '../config/templates.js'

export { compileEntityTemplate, compilePathPattern, isStorableText, maxEntityLength, reservedPrefix, type EntityTemplate, type PathPattern } from '../config/templates.js'

/** A route ready to match requests. */
export interface Route {
  config: RouteConfig
  pattern: PathPattern
  entity: EntityTemplate | undefined
  /** Where a request names its operation (`idempotency_key`, by default `{header.Idempotency-Key}`). */
  key: EntityTemplate
  /** The header the key is, when it is exactly one header (its value is then read with the key header's grammar). */
  keyHeader: string | undefined
  /** Headers the gateway reads (entity sources, claimed tenant, key, a read body's Content-Type): always forwarded as read. */
  decisionHeaders: string[]
  /** Those of them that must arrive once (a key header's grammar already refuses two joined). */
  singleHeaders: string[]
  /** Whether a decision reads the body (entity, key or claimed tenant): it is then read, once, before any of them. */
  readsBody: boolean
  /** How its refusals are written, chosen once per route: problem+json (in its `error_envelope`), or JSON-RPC errors. */
  answers: 'problem' | 'jsonrpc'
  /** An MCP route's rules, each compiled once into the Route its messages are decided by (src/gateway/mcp.ts). */
  mcp?: McpRoutes
  /** A tool's rule: the argument that carries the fence (`fence_argument`). */
  fenceArgument?: string
}

/** The Routes of an MCP route's messages: per tool of `tools/call`, per other method, and its GET and DELETE. */
export interface McpRoutes {
  tools: ReadonlyMap<string, Route>
  methods: ReadonlyMap<string, Route>
  /** GET (the session's stream) and DELETE (its end): passed through, fence and key off. */
  passthrough: Route
}

/**
 * Compiles a route's templates once; an MCP route's rules too, each into a Route of its own.
 *
 * @example compileRoute(parseConfig(file).routes[0]).mcp?.tools.get('create_ticket')?.config.name // 'tickets-mcp/create_ticket'
 */
export function compileRoute(config: RouteConfig, answers: Route['answers'] = config.mcp ? 'jsonrpc' : 'problem'): Route {
  const pattern = compilePathPattern(config.path)
  const entity = config.entity === undefined ? undefined : compileEntityTemplate(config.entity)
  const key = compileKeyTemplate(config.idempotency_key)
  for (const [field, template] of [['entity', entity], ['idempotency_key', key]] as const) {
    const missing = template?.params.find((p) => !pattern.params.includes(p))
    if (missing) throw new Error(`route ${config.name}: ${field} uses params.${missing}, which ${config.path} does not define`)
  }
  const singleHeaders = headersOf(entity)
  if (config.claimed_tenant?.startsWith('header.')) singleHeaders.push(config.claimed_tenant.slice('header.'.length).toLowerCase())
  // A body read as a form or as JSON by its Content-Type goes on with that Content-Type:
  // `Connection: content-type` must not make the upstream read it as something else.
  const readsBody = entity?.usesBody === true || (config.idempotency !== 'off' && key.usesBody) || config.claimed_tenant?.startsWith('body.') === true
  if (readsBody) singleHeaders.push('content-type')
  // The key too: an upstream that dedupes on it (`upstream_dedupes_keys`) would run a retried
  // unknown outcome again if `Connection: idempotency-key` stripped it on the way.
  const keyHeaders = config.idempotency === 'off' ? [] : headersOf(key)
  const decisionHeaders = [...new Set([...singleHeaders, ...keyHeaders])]
  const route: Route = { config, pattern, entity, key, keyHeader: keyHeaderOf(key), decisionHeaders, singleHeaders: [...new Set(singleHeaders)], readsBody, answers }
  if (config.mcp) route.mcp = compileMcpRoutes(config)
  return route
}

function compileMcpRoutes(config: RouteConfig): McpRoutes {
  const tools = new Map<string, Route>()
  const methods = new Map<string, Route>()
  for (const rule of config.mcp ?? []) {
    const compiled = compileRoute(mcpRuleConfig(config, rule), 'jsonrpc')
    if (rule.fence_argument !== undefined) compiled.fenceArgument = rule.fence_argument
    if (rule.tool !== undefined) tools.set(rule.tool, compiled)
    else methods.set(rule.method!, compiled)
  }
  // A GET or DELETE carries no message: nothing to decide but the route's scopes.
  const { entity: _entity, claimed_tenant: _claim, mcp: _mcp, ...rest } = config
  const passthrough = compileRoute({ ...rest, fence: 'off', idempotency: 'off' }, 'problem')
  return { tools, methods, passthrough }
}

/** The headers a template reads, lower-cased. */
function headersOf(template: EntityTemplate | undefined): string[] {
  return (template?.parts ?? []).flatMap((p) => ('source' in p && p.source === 'header' ? [p.name] : []))
}

export interface RouteMatch { route: Route; params: Record<string, string> }

/**
 * Finds the route for a method and a normalised pathname; params are percent-decoded.
 * When several routes match, the most specific wins: reading segments left to
 * right, the first literal segment where another route has a parameter.
 *
 * @example
 * const router = createRouter(config.routes)
 * router.match('POST', '/payments/42/capture') // { route, params: { invoice_id: '42' } }
 */
export function createRouter(routes: RouteConfig[]) {
  // The most specific route wins, so that where a route sits in the file or in the
  // rules table (which has no order) never decides where a request goes.
  const compiled = routes.map((r) => compileRoute(r)).sort((a, b) => bySpecificity(a.pattern.segments, b.pattern.segments))
  return {
    routes: compiled,
    match(method: string, pathname: string): RouteMatch | undefined {
      const segments = pathname.split('/').slice(1)
      for (const route of compiled) {
        const own = route.config.method === method
        if (!(own || (route.mcp && (method === 'GET' || method === 'DELETE'))) || route.pattern.segments.length !== segments.length) continue
        const params = matchSegments(route.pattern.segments, segments)
        if (params) return { route: own ? route : route.mcp!.passthrough, params }
      }
      return undefined
    },
  }
}
export type Router = ReturnType<typeof createRouter>

/** Left to right, the first position where one pattern has a literal and the other a parameter decides. */
function bySpecificity(a: Segment[], b: Segment[]): number {
  for (let i = 0; i < Math.min(a.length, b.length); i++) {
    const la = 'literal' in a[i]!
    const lb = 'literal' in b[i]!
    if (la !== lb) return la ? -1 : 1
  }
  return 0
}

function matchSegments(pattern: Segment[], segments: string[]): Record<string, string> | undefined {
  const params: Record<string, string> = {}
  for (let i = 0; i < pattern.length; i++) {
    const p = pattern[i]!
    const s = segments[i]!
    if ('literal' in p) {
      if (p.literal !== s) return undefined
    } else {
      if (s === '') return undefined
      try {
        params[p.param] = decodeURIComponent(s)
      } catch {
        throw new FencegateError('invalid_request', `path segment ${i + 1} is not valid percent-encoding`)
      }
    }
  }
  return params
}

/** What an entity template may read from a request. */
export interface EntitySources {
  params: Record<string, string>
  query: URLSearchParams
  headers: HeaderView
  /** The body's one reading (a form, when its Content-Type says so, else strict JSON); refuses a body it cannot read. */
  body(): BodyFields
}

/**
 * Resolves an entity template against a request, or throws `entity_unresolved`.
 *
 * @example resolveEntity(compileEntityTemplate('invoice:{params.id}'), sources) // 'invoice:42'
 */
export function resolveEntity(template: EntityTemplate, sources: EntitySources): string {
  const filled = fillTemplate(template, sources)
  if ('missing' in filled) throw new FencegateError('entity_unresolved', `${filled.missing} is missing from the request`, { source: filled.missing })
  const entity = filled.value
  if (entity.length > maxEntityLength) throw new FencegateError('entity_unresolved', `the entity is longer than ${maxEntityLength} characters`)
  if (!isStorableText(entity)) throw new FencegateError('entity_unresolved', 'the entity contains control characters or invalid Unicode')
  return entity
}

/**
 * A template filled from a request, or the first source it names that the request lacks
 * (absent or empty). A header part is read as `readHeader` reads it: entities take the value
 * as sent, keys their header grammar.
 *
 * @example fillTemplate(compileEntityTemplate('invoice:{params.id}'), sources) // { value: 'invoice:42' }
 */
export function fillTemplate(template: EntityTemplate, sources: EntitySources, readHeader: (value: string | null, name: string) => string | undefined = asSent): { value: string } | { missing: string } {
  let value = ''
  for (const part of template.parts) {
    if ('literal' in part) {
      value += part.literal
      continue
    }
    const read = part.source === 'header' ? readHeader(sources.headers.get(part.name), part.name) : readSource(part, sources)
    const label = part.source === 'body' ? `body.${part.path.join('.')}` : `${part.source}.${part.name}`
    if (read === undefined || read === '') return { missing: label }
    const checked = partValue(template, part, read)
    if ('refused' in checked) {
      const [code, what] = template.kind === 'entity' ? ['entity_unresolved', 'the entity'] as const : ['invalid_idempotency_key', 'the idempotency key'] as const
      throw new FencegateError(code, `${label}, which ${what} reads, ${checked.refused}`, { source: label })
    }
    value += checked.value
  }
  return { value }
}

const asSent = (value: string | null) => value ?? undefined

function readSource(part: Exclude<TemplatePart, { literal: string }>, s: EntitySources): string | undefined {
  switch (part.source) {
    case 'params': return s.params[part.name]
    case 'query': {
      // `?id=1&id=2`: the gateway would read the first, an upstream may read the last.
      if (s.query.getAll(part.name).length > 1) throw new FencegateError('invalid_request', `the query names ${part.name} more than once; which one counts is ambiguous`)
      return s.query.get(part.name) ?? undefined
    }
    case 'header': return s.headers.get(part.name) ?? undefined
    case 'body': return s.body().at(part.path)
  }
}
