import { FencegateError } from './problems.js'
import type { RouteConfig } from './config/schema.js'

/** Paths under this prefix belong to fencegate itself; no route may claim them. */
export const reservedPrefix = '/_fencegate/'
/** The longest entity string fencegate accepts. */
export const maxEntityLength = 512

type Segment = { literal: string } | { param: string }
export interface PathPattern { segments: Segment[]; params: string[] }

/** Compiles a hono-style path (`/payments/:invoice_id/capture`) into segments. */
export function compilePathPattern(path: string): PathPattern {
  if (!path.startsWith('/')) throw new Error('must start with /')
  const segments = path.split('/').slice(1).map((s): Segment => {
    if (!s.startsWith(':')) {
      if (/[?#%]/.test(s)) throw new Error(`segment ${JSON.stringify(s)} may not contain ? # or %`)
      return { literal: s }
    }
    const name = s.slice(1)
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new Error(`bad parameter name ${JSON.stringify(s)}`)
    return { param: name }
  })
  const params = segments.flatMap((s) => ('param' in s ? [s.param] : []))
  if (new Set(params).size !== params.length) throw new Error('a parameter name appears twice')
  return { segments, params }
}

type TemplatePart = { literal: string } | { source: 'params' | 'query' | 'header'; name: string } | { source: 'body'; path: string[] }
export interface EntityTemplate { parts: TemplatePart[]; usesBody: boolean; params: string[] }

/** Compiles `invoice:{params.invoice_id}`; sources are params.X, query.X, header.X and body.a.b. */
export function compileEntityTemplate(template: string): EntityTemplate {
  const parts: TemplatePart[] = []
  const re = /\{([^{}]*)\}/g
  let last = 0
  for (let m = re.exec(template); m; m = re.exec(template)) {
    if (m.index > last) parts.push({ literal: template.slice(last, m.index) })
    last = re.lastIndex
    const [source, ...rest] = m[1]!.split('.')
    if (rest.length === 0 || rest.some((r) => r === '')) throw new Error(`placeholder {${m[1]}} must look like {source.name}`)
    if (source === 'body') parts.push({ source, path: rest })
    else if (source === 'params' || source === 'query' || source === 'header') {
      if (rest.length !== 1) throw new Error(`placeholder {${m[1]}}: ${source} takes one name`)
      parts.push({ source, name: source === 'header' ? rest[0]!.toLowerCase() : rest[0]! })
    } else throw new Error(`placeholder {${m[1]}}: unknown source ${JSON.stringify(source)} (use params, query, header or body)`)
  }
  if (last < template.length) parts.push({ literal: template.slice(last) })
  if (/[{}]/.test(parts.flatMap((p) => ('literal' in p ? [p.literal] : [])).join(''))) throw new Error('unbalanced { or }')
  if (!parts.some((p) => 'source' in p)) throw new Error('an entity template needs at least one {placeholder}')
  return {
    parts,
    usesBody: parts.some((p) => 'source' in p && p.source === 'body'),
    params: parts.flatMap((p) => ('source' in p && p.source === 'params' ? [p.name] : [])),
  }
}

/** A route ready to match requests. */
export interface Route {
  config: RouteConfig
  pattern: PathPattern
  entity: EntityTemplate | undefined
  /** Headers the fence decision reads (entity sources, claimed tenant): always forwarded as read. */
  decisionHeaders: string[]
}

export function compileRoute(config: RouteConfig): Route {
  const pattern = compilePathPattern(config.path)
  const entity = config.entity === undefined ? undefined : compileEntityTemplate(config.entity)
  const missing = entity?.params.find((p) => !pattern.params.includes(p))
  if (missing) throw new Error(`route ${config.name}: entity uses params.${missing}, which ${config.path} does not define`)
  const decisionHeaders = (entity?.parts ?? []).flatMap((p) => ('source' in p && p.source === 'header' ? [p.name] : []))
  if (config.claimed_tenant?.startsWith('header.')) decisionHeaders.push(config.claimed_tenant.slice('header.'.length).toLowerCase())
  return { config, pattern, entity, decisionHeaders }
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
  const compiled = routes.map(compileRoute).sort((a, b) => bySpecificity(a.pattern.segments, b.pattern.segments))
  return {
    routes: compiled,
    match(method: string, pathname: string): RouteMatch | undefined {
      const segments = pathname.split('/').slice(1)
      for (const route of compiled) {
        if (route.config.method !== method || route.pattern.segments.length !== segments.length) continue
        const params = matchSegments(route.pattern.segments, segments)
        if (params) return { route, params }
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

/**
 * Text PostgreSQL stores as given: no control characters (it refuses NUL), no
 * lone surrogates and no U+FFFD (both stand for bytes that were not valid
 * UTF-8, so two different inputs would collapse into one entity and one fence).
 */
export function isStorableText(text: string): boolean {
  return text.isWellFormed() && !/[\u0000-\u001f\u007f\ufffd]/.test(text)
}

/** What an entity template may read from a request. */
export interface EntitySources {
  params: Record<string, string>
  query: URLSearchParams
  headers: Headers
  /** The parsed body (a form, when its Content-Type says so, else JSON), or undefined when it does not parse. */
  body(): unknown
}

/**
 * Resolves an entity template against a request, or throws `entity_unresolved`.
 *
 * @example resolveEntity(compileEntityTemplate('invoice:{params.id}'), sources) // 'invoice:42'
 */
export function resolveEntity(template: EntityTemplate, sources: EntitySources): string {
  let entity = ''
  for (const part of template.parts) {
    if ('literal' in part) {
      entity += part.literal
      continue
    }
    const value = readSource(part, sources)
    if (value === undefined || value === '') {
      const where = part.source === 'body' ? `body.${part.path.join('.')}` : `${part.source}.${part.name}`
      throw new FencegateError('entity_unresolved', `${where} is missing from the request`, { source: where })
    }
    entity += value
  }
  if (entity.length > maxEntityLength) throw new FencegateError('entity_unresolved', `the entity is longer than ${maxEntityLength} characters`)
  if (!isStorableText(entity)) throw new FencegateError('entity_unresolved', 'the entity contains control characters or invalid Unicode')
  return entity
}

function readSource(part: Exclude<TemplatePart, { literal: string }>, s: EntitySources): string | undefined {
  switch (part.source) {
    case 'params': return s.params[part.name]
    case 'query': return s.query.get(part.name) ?? undefined
    case 'header': return s.headers.get(part.name) ?? undefined
    case 'body': {
      let node: unknown = s.body()
      for (const key of part.path) {
        if (node === null || typeof node !== 'object' || !Object.hasOwn(node, key)) return undefined
        node = (node as Record<string, unknown>)[key]
      }
      if (typeof node === 'string') return node
      // Beyond 2^53 two different ids would parse to one number and share a fence.
      if (typeof node === 'number' && Number.isSafeInteger(node)) return String(node)
      return undefined
    }
  }
}
