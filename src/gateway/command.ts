import type { HeaderView } from '../http/exchange.js'
import { readBodyFields, type BodyFields } from '../http/body-fields.js'
import type { Identity } from '../http/identity.js'
import { FencegateError } from '../http/problems.js'
import { fenceHeader } from './fence.js'
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
 * A header the route reads (the fence, entity, claimed tenant, key, the Content-Type of a body it
 * reads) that arrived more than once, or also under a name with `_` for `-`, is refused: the
 * gateway would read the joined "A-1, A-1", an upstream may read the first; WSGI and CGI read
 * `X_Tenant` as `X-Tenant`. A key header's grammar refuses two joined keys itself.
 */
export function refuseAmbiguousHeaders(route: Route, headers: HeaderView): void {
  const twice = headers.repeated && route.singleHeaders.find((name) => headers.repeated!(name))
  if (twice) throw new FencegateError('invalid_request', `the request sends header ${twice} more than once; which one counts is ambiguous`)
  headers.forEach((_, name) => {
    if (!name.includes('_')) return
    const dashed = name.toLowerCase().replaceAll('_', '-')
    if (dashed === fenceHeader || route.decisionHeaders.includes(dashed)) throw new FencegateError('invalid_request', `the request sends header ${name}, which upstreams that read _ as - take for ${dashed}, a header the route reads`)
  })
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
  return sources.body().at(path)
}

/**
 * What an entity template and a claimed tenant may read from a request; the body is read at
 * most once, when first asked for, in its one reading (src/http/body-fields.ts): a form when
 * its Content-Type says so, else strict JSON, refused where an upstream could read it otherwise.
 */
export function entitySources(request: { headers: HeaderView }, url: URL, params: Record<string, string>, bytes: Uint8Array, read?: BodyFields): EntitySources {
  let fields: BodyFields | undefined = read
  return {
    params,
    query: url.searchParams,
    headers: request.headers,
    body: () => (fields ??= readBodyFields(request.headers, bytes)),
  }
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
