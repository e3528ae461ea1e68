import type { HeaderView } from '../http/exchange.js'
import { isFormBody, parseFormBody } from '../http/form-body.js'
import { hasDuplicateKeys } from '../http/json-keys.js'
import type { Identity } from '../http/identity.js'
import { FencegateError } from '../http/problems.js'
import { resolveEntity, type EntitySources, type Route } from './route.js'
import { entityPolicy, freezeThatCouldApply } from '../rules/entities.js'
import type { RuleSet } from '../rules/registry.js'

/**
 * What a request says about its command, read before the store decides it:
 * the sources an entity is resolved from, the fence mode and ordering that
 * apply to it (the route's, unless an entity rule overrides them), a claimed
 * tenant, and the job behind a lease-bound entity. Pure functions: the
 * pipeline (src/pipeline.ts) orders them.
 */

/** The fence mode and the delivery order for one command. */
export interface CommandPolicy {
  fence: Route['config']['fence']
  ordering: Route['config']['ordering']
  /** The entity, when the entity rules needed it resolved (so it is resolved once). */
  entity?: string
}

/**
 * The route's fence mode and ordering unless an entity rule overrides them (a
 * lease route's fence mode never is); an entity that a rule freezes is refused
 * here (`entity_frozen`), before its fence or key is looked at.
 *
 * @example
 * const { fence, ordering } = commandPolicy(route, 'acme', sources, rules.current())
 */
export function commandPolicy(route: Route, tenant: string, sources: EntitySources, rules: RuleSet): CommandPolicy {
  const { config: rc, entity: template } = route
  if (rules.entityRules.length === 0 || !template) return { fence: rc.fence, ordering: rc.ordering }
  let entity: string
  try {
    entity = resolveEntity(template, sources)
  } catch (err) {
    if (!(err instanceof FencegateError) || err.code !== 'entity_unresolved') throw err
    // Unresolvable: no rule can match it, and the fence step reports it if a fence needs it;
    // but while an entity this route could reach is frozen, a command naming none is refused.
    const first = template.parts[0]
    const frozenBy = freezeThatCouldApply(rules.entityRules, tenant, first && 'literal' in first ? first.literal : '')
    if (frozenBy !== undefined) throw new FencegateError('entity_unresolved', `${err.detail}; rule ${frozenBy} freezes an entity this route reaches, so a command must name its entity`, err.extras)
    return { fence: rc.fence, ordering: rc.ordering }
  }
  const policy = entityPolicy(rules.entityRules, tenant, entity)
  if (policy.frozenBy !== undefined) {
    throw new FencegateError('entity_frozen', `${entity} is frozen by rule ${policy.frozenBy}`, { entity, rule: policy.frozenBy })
  }
  return {
    fence: policy.fence !== undefined && rc.fence !== 'lease' ? policy.fence : rc.fence,
    ordering: policy.ordering ?? rc.ordering,
    entity,
  }
}

/**
 * A header the route reads (entity, claimed tenant, the Content-Type of a body it reads) that
 * arrived more than once is refused: the gateway would read the joined "A-1, A-1", an upstream
 * may read the first. A key header's grammar refuses two joined keys itself.
 */
export function refuseRepeatedHeaders(route: Route, headers: HeaderView): void {
  const twice = headers.repeated && route.singleHeaders.find((name) => headers.repeated!(name))
  if (twice) throw new FencegateError('invalid_request', `the request sends header ${twice} more than once; which one counts is ambiguous`)
}

/**
 * A tenant the request itself names (`claimed_tenant`) is evidence, never
 * authority: it must agree with the token's tenant or the request is refused.
 */
export function checkClaimedTenant(where: string, sources: EntitySources, identity: Identity): void {
  const claimed = readClaim(where, sources)
  if (claimed !== undefined && claimed !== identity.tenant) {
    throw new FencegateError('tenant_mismatch', `the request claims another tenant (${where}) than its token`)
  }
}

function readClaim(where: string, sources: EntitySources): string | undefined {
  const [source, ...path] = where.split('.')
  if (source === 'header') return sources.headers.get(path[0]!) ?? undefined
  let node = sources.body()
  for (const key of path) {
    if (node === null || typeof node !== 'object' || !Object.hasOwn(node, key)) return undefined
    node = (node as Record<string, unknown>)[key]
  }
  return node === undefined ? undefined : String(node)
}

/**
 * What an entity template and a claimed tenant may read from a request; the
 * body is parsed at most once, when read: as a form when its Content-Type says
 * so (src/form-body.ts), else as JSON (text/plain, no Content-Type or any other
 * type: upstreams that read JSON regardless of it read it so). A multipart body
 * is refused when read: the gateway cannot read its fields, so a claimed tenant
 * in one would pass unseen while an upstream reading multipart acts on it.
 */
export function entitySources(request: { headers: HeaderView }, url: URL, params: Record<string, string>, bytes: Uint8Array): EntitySources {
  let body: unknown
  let parsed = false
  return {
    params,
    query: url.searchParams,
    headers: request.headers,
    // The Content-Type is looked at only by a route that reads the body.
    body: () => {
      const type = request.headers.get('content-type')
      if (type?.trimStart().toLowerCase().startsWith('multipart/')) throw new FencegateError('invalid_request', 'the route reads the body, and a multipart body is not read; send it as JSON or as a form')
      if (!parsed) {
        parsed = true
        body = isFormBody(type) ? parseFormBody(unlessJson(bytes)) : parseJson(bytes)
      }
      return body
    },
  }
}

/**
 * A JSON body, or undefined when it is not JSON. One that names a key twice is refused: the
 * gateway would read the last, an upstream may read the first (src/http/json-keys.ts).
 */
function parseJson(bytes: Uint8Array): unknown {
  let text: string
  let body: unknown
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes)
    body = JSON.parse(text)
  } catch {
    return undefined
  }
  if (hasDuplicateKeys(text)) throw new FencegateError('invalid_request', 'the JSON body names a key twice in one object; which one counts is ambiguous')
  return body
}

/**
 * A body declared as a form that is a JSON object or array is refused: its JSON text can
 * hide form fields in its strings (`{"tenant_id":"B","x":"&tenant_id=A"}`), which the
 * gateway would read while an upstream that reads JSON acts on the others.
 */
function unlessJson(bytes: Uint8Array): Uint8Array {
  let i = 0
  for (;;) {
    if (bytes[i] === 0x20 || bytes[i] === 0x09 || bytes[i] === 0x0a || bytes[i] === 0x0d) i++
    // A UTF-8 byte-order mark (EF BB BF): decoders and many JSON readers skip it, so `\uFEFF{...}` is JSON to them.
    else if (bytes[i] === 0xef && bytes[i + 1] === 0xbb && bytes[i + 2] === 0xbf) i += 3
    else break
  }
  if (bytes[i] === 0x7b || bytes[i] === 0x5b) throw new FencegateError('invalid_request', 'the body is declared as a form but is JSON; send it as Content-Type: application/json')
  return bytes
}

/**
 * The route's entity for an audit row, or undefined when the route has none or
 * the request does not resolve it: a refusal for a bad header still names the
 * entity the command was about, so `GET /audit?entity=` finds it.
 */
export function entityOf(route: Route, sources: EntitySources): string | undefined {
  if (!route.entity) return undefined
  try {
    return resolveEntity(route.entity, sources)
  } catch {
    return undefined
  }
}

/** The job id behind a `fence: lease` entity (`job:42`); an id that cannot exist matches no lease. */
export function leaseJobOf(mode: string, entity: string | undefined): string | null {
  if (mode !== 'lease') return null
  const id = entity?.slice('job:'.length) ?? ''
  return /^[1-9][0-9]{0,17}$/.test(id) ? id : '0'
}
