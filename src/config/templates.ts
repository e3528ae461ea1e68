/**
 * The grammar of route paths and entity templates: compiled when the configuration is
 * validated (src/config/schema.ts) and used by the router at request time (src/gateway/route.ts).
 * Plain functions over strings; a bad pattern throws an Error whose message names the mistake.
 */

/** Paths under this prefix belong to fencegate itself; no route may claim them. */
export const reservedPrefix = '/_fencegate/'
/** The longest entity string fencegate accepts. */
export const maxEntityLength = 512

export type Segment = { literal: string } | { param: string }
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

export type TemplatePart = { literal: string } | { source: 'params' | 'query' | 'header'; name: string } | { source: 'body'; path: string[] }
export interface EntityTemplate { parts: TemplatePart[]; usesBody: boolean; params: string[] }

/** Compiles `invoice:{params.invoice_id}`; sources are params.X, query.X, header.X and body.a.b. */
export function compileEntityTemplate(template: string): EntityTemplate {
  return compileTemplate(template, 'an entity template')
}

/** What a route's key is read from unless it says otherwise: the header Stripe's clients send. */
export const defaultKeyTemplate = '{header.Idempotency-Key}'

/**
 * Compiles a route's `idempotency_key` (`{body.idempotency_key}`, `report:{body.type}:{body.period}`):
 * the entity grammar, so a key is read from a request exactly as an entity is.
 *
 * @example compileKeyTemplate('{header.PayPal-Request-Id}').parts // [{ source: 'header', name: 'paypal-request-id' }]
 */
export function compileKeyTemplate(template: string): EntityTemplate {
  return compileTemplate(template, 'a key template')
}

/**
 * The header a key template is, when it is exactly one header (`{header.Idempotency-Key}`):
 * the header whose value `upstream_key: tenant_scoped` replaces and the answer echoes.
 *
 * @example keyHeaderOf(compileKeyTemplate('{header.PayPal-Request-Id}')) // 'paypal-request-id'
 */
export function keyHeaderOf(key: EntityTemplate): string | undefined {
  const [only, ...rest] = key.parts
  return rest.length === 0 && only && 'source' in only && only.source === 'header' ? only.name : undefined
}

function compileTemplate(template: string, what: string): EntityTemplate {
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
  if (!parts.some((p) => 'source' in p)) throw new Error(`${what} needs at least one {placeholder}`)
  return {
    parts,
    usesBody: parts.some((p) => 'source' in p && p.source === 'body'),
    params: parts.flatMap((p) => ('source' in p && p.source === 'params' ? [p.name] : [])),
  }
}

/**
 * Text PostgreSQL stores as given: no control characters (it refuses NUL), no
 * lone surrogates and no U+FFFD (both stand for bytes that were not valid
 * UTF-8, so two different inputs would collapse into one entity and one fence).
 */
export function isStorableText(text: string): boolean {
  return text.isWellFormed() && !/[\u0000-\u001f\u007f\ufffd]/.test(text)
}

