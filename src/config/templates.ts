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

/**
 * What a placeholder's value must be, declared after a colon (`{params.invoice_id:int}`), so
 * that one id written two ways (`042`, `+42`, `42.0`) is refused instead of getting a fence
 * order of its own: `int` is a decimal integer without sign or leading zeros up to 2^53 - 1,
 * `uuid` a UUID in 8-4-4-4-12 hex digits (read in lower case, as PostgreSQL's uuid reads
 * either), `token` letters, digits, `_` and `-`. No regular expressions: a matcher is linear.
 */
export type PartType = 'int' | 'uuid' | 'token'
const partTypes: Record<PartType, { test: (v: string) => boolean; what: string }> = {
  int: { test: (v) => /^(0|[1-9][0-9]{0,15})$/.test(v) && Number(v) <= Number.MAX_SAFE_INTEGER, what: 'a decimal integer without sign or leading zeros, at most 2^53 - 1' },
  uuid: { test: (v) => /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(v), what: 'a UUID (8-4-4-4-12 hex digits)' },
  token: { test: (v) => /^[A-Za-z0-9_-]+$/.test(v), what: 'letters, digits, _ and -' },
}

type Source = { source: 'params' | 'query' | 'header'; name: string } | { source: 'body'; path: string[] }
export type TemplatePart = { literal: string } | (Source & { type?: PartType })
export interface EntityTemplate {
  parts: TemplatePart[]
  usesBody: boolean
  params: string[]
  /** An entity's untyped parts refuse what reads as another id (whitespace, control and format characters, non-ASCII digits); a key's take any storable text. */
  kind: 'entity' | 'key'
  /**
   * With two placeholders or more, the characters of the literals between them (and `%`),
   * percent-encoded in each value: else `{a}:{b}` reads `x:y` + `z` and `x` + `y:z` as one.
   */
  escape: RegExp | undefined
}

/**
 * Compiles `invoice:{params.invoice_id:int}`; sources are params.X, query.X, header.X and body.a.b,
 * each optionally typed (`:int`, `:uuid`, `:token`).
 *
 * @example compileEntityTemplate('invoice:{params.invoice_id:int}').parts[1] // { source: 'params', name: 'invoice_id', type: 'int' }
 */
export function compileEntityTemplate(template: string): EntityTemplate {
  return compileTemplate(template, 'an entity template', 'entity')
}

/**
 * A placeholder's value as the command reads it, or why it is refused: its type's canonical
 * form, or for an untyped entity part the value as sent unless it holds characters that read
 * as another id; with the template's separators percent-encoded.
 *
 * @example partValue(compileEntityTemplate('invoice:{params.id:int}'), part, '042') // { refused: '… a decimal integer …' }
 */
export function partValue(template: EntityTemplate, part: Source & { type?: PartType }, value: string): { value: string } | { refused: string } {
  if (part.type) {
    const type = partTypes[part.type]
    if (!type.test(value)) return { refused: `must be ${type.what}` }
    if (part.type === 'uuid') value = value.toLowerCase()
  } else if (template.kind === 'entity' && /[\s\p{Cc}\p{Cf}]|[^\P{Nd}0-9]/u.test(value)) {
    return { refused: 'holds whitespace, a control or format character, or a non-ASCII digit, which an upstream may read as another id' }
  }
  return { value: template.escape ? value.replace(template.escape, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase().padStart(2, '0')}`) : value }
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
  return compileTemplate(template, 'a key template', 'key')
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

function compileTemplate(template: string, what: string, kind: EntityTemplate['kind']): EntityTemplate {
  const parts: TemplatePart[] = []
  const re = /\{([^{}]*)\}/g
  let last = 0
  for (let m = re.exec(template); m; m = re.exec(template)) {
    if (m.index > last) parts.push({ literal: template.slice(last, m.index) })
    last = re.lastIndex
    if (parts.length > 0 && 'source' in parts[parts.length - 1]!) throw new Error(`placeholder {${m[1]}} follows another without a literal between them, so their values could not be told apart`)
    parts.push(compilePlaceholder(m[1]!))
  }
  if (last < template.length) parts.push({ literal: template.slice(last) })
  if (/[{}]/.test(parts.flatMap((p) => ('literal' in p ? [p.literal] : [])).join(''))) throw new Error('unbalanced { or }')
  if (!parts.some((p) => 'source' in p)) throw new Error(`${what} needs at least one {placeholder}`)
  return {
    parts,
    usesBody: parts.some((p) => 'source' in p && p.source === 'body'),
    params: parts.flatMap((p) => ('source' in p && p.source === 'params' ? [p.name] : [])),
    kind,
    escape: separatorsOf(parts),
  }
}

/** `params.id:int` → its source and type. */
function compilePlaceholder(text: string): Source & { type?: PartType } {
  const [ref, type, ...more] = text.split(':')
  if (more.length > 0 || (type !== undefined && !Object.hasOwn(partTypes, type))) throw new Error(`placeholder {${text}}: unknown type after : (use ${Object.keys(partTypes).join(', ')})`)
  const typed = type === undefined ? {} : { type: type as PartType }
  const [source, ...rest] = ref!.split('.')
  if (rest.length === 0 || rest.some((r) => r === '')) throw new Error(`placeholder {${text}} must look like {source.name}`)
  if (source === 'body') return { source, path: rest, ...typed }
  if (source === 'params' || source === 'query' || source === 'header') {
    if (rest.length !== 1) throw new Error(`placeholder {${text}}: ${source} takes one name`)
    return { source, name: source === 'header' ? rest[0]!.toLowerCase() : rest[0]!, ...typed }
  }
  throw new Error(`placeholder {${text}}: unknown source ${JSON.stringify(source)} (use params, query, header or body)`)
}

/** The characters to escape in values: `%` and those of each literal between two placeholders. */
function separatorsOf(parts: TemplatePart[]): RegExp | undefined {
  const between = parts.filter((p, i) => 'literal' in p && i > 0 && i < parts.length - 1) as { literal: string }[]
  if (parts.filter((p) => 'source' in p).length < 2) return undefined
  const chars = new Set(['%', ...between.flatMap((p) => [...p.literal])])
  return new RegExp(`[${[...chars].map((c) => c.replace(/[\\\]^-]/g, '\\$&')).join('')}]`, 'g')
}

/**
 * Text PostgreSQL stores as given: no control characters (it refuses NUL), no
 * lone surrogates and no U+FFFD (both stand for bytes that were not valid
 * UTF-8, so two different inputs would collapse into one entity and one fence).
 */
export function isStorableText(text: string): boolean {
  return text.isWellFormed() && !/[\u0000-\u001f\u007f\ufffd]/.test(text)
}

