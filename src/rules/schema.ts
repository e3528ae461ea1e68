import { z } from 'zod'
import { checkRouteSet, entityRuleSchema, routeSchema, type EntityRuleConfig, type RouteConfig } from '../config/schema.js'

/** The two kinds of rule: a route (request → entity and checks) and an entity rule (a pattern's overrides). */
export type RuleKind = 'route' | 'entity'

/** A rule as an operator writes it (file or API): the input of the config schema, stored as given. */
export type RawRule = Record<string, unknown> & { name: string }

/** Every rule of one version, validated together. */
export interface ValidRules {
  routes: RouteConfig[]
  entityRules: EntityRuleConfig[]
}

/** A rule set that fails validation; `problems` name each bad field, as config errors do. */
export class RuleError extends Error {
  override name = 'RuleError'
  constructor(readonly problems: string[]) {
    super(`invalid rules:\n  ${problems.join('\n  ')}`)
  }
}

/** Whether a raw rule is an entity rule (it names `entity_match`) or a route. */
export function kindOf(rule: Record<string, unknown>): RuleKind {
  return Object.hasOwn(rule, 'entity_match') ? 'entity' : 'route'
}

const ruleSetSchema = (authMode: 'none' | 'jwt', canAttest: boolean) => z.object({
  routes: z.array(routeSchema),
  entity_rules: z.array(entityRuleSchema),
}).superRefine((s, ctx) => {
  checkRouteSet(s.routes, authMode, ctx, canAttest)
  const names = new Set(s.routes.map((r) => r.name))
  s.entity_rules.forEach((r, i) => {
    if (names.has(r.name)) ctx.addIssue({ code: 'custom', path: ['entity_rules', i, 'name'], message: `a route is already named ${r.name}` })
    names.add(r.name)
  })
})

/**
 * Validates a whole rule set with the config file's own schemas: each rule on
 * its own, then the checks across rules (duplicate names, two routes matching
 * one request, scopes without auth). Upstream credentials are not rules: a
 * rule naming `upstream_headers`, `upstream_tls` or `forward_authorization` is
 * refused, because rules are stored in the database, shown by the admin API and
 * written by any `fencegate:admin` token (see docs/rules.md). `canAttest` says
 * whether the gateway has an attestation key; it defaults to true only for
 * the CLI's early check, which cannot know, and a gateway passes its own.
 *
 * @example
 * validateRuleSet([{ name: 'capture', method: 'POST', path: '/p/:id', upstream: 'http://127.0.0.1:9001', entity: 'p:{params.id}' }], 'none', false)
 */
export function validateRuleSet(rules: RawRule[], authMode: 'none' | 'jwt', canAttest = true): ValidRules {
  const problems: string[] = []
  for (const r of rules) {
    if (kindOf(r) === 'route' && Object.hasOwn(r, 'upstream_headers')) {
      problems.push(`${r.name}: upstream_headers: upstream credentials stay in each gateway's configuration file, which applies them by route name`)
    }
    if (kindOf(r) === 'route' && Object.hasOwn(r, 'upstream_tls')) {
      problems.push(`${r.name}: upstream_tls: certificates and CAs stay in each gateway's configuration file, which reads them at start and applies them by route name`)
    }
    // A rule that passes callers' tokens on would hand every tenant's token to whoever writes rules.
    if (kindOf(r) === 'route' && Object.hasOwn(r, 'forward_authorization')) {
      problems.push(`${r.name}: forward_authorization: whether callers' tokens reach the upstream is set in each gateway's configuration file only, which applies it by route name`)
    }
  }
  const input = { routes: rules.filter((r) => kindOf(r) === 'route'), entity_rules: rules.filter((r) => kindOf(r) === 'entity') }
  const result = ruleSetSchema(authMode, canAttest).safeParse(input)
  if (!result.success) {
    for (const issue of result.error.issues) {
      const [list, index, ...rest] = issue.path
      const rule = typeof index === 'number' ? (input[list as 'routes' | 'entity_rules'][index]?.name ?? `#${index}`) : '(rules)'
      problems.push(`${String(rule)}: ${rest.map(String).join('.') || '(rule)'}: ${issue.message}`)
    }
  }
  if (problems.length > 0 || !result.success) throw new RuleError(problems)
  return { routes: result.data.routes, entityRules: result.data.entity_rules }
}

/**
 * The canonical raw form of a validated route, as the config file's seed is
 * stored: durations in milliseconds, the upstream as one URL, and without
 * `upstream_headers`, `upstream_tls` and `forward_authorization` (credentials, and
 * whether callers' tokens are passed on, never leave the configuration file).
 */
export function routeToRule(r: RouteConfig): RawRule {
  const { upstream, upstream_headers: _credentials, upstream_tls: _tls, forward_authorization: _forward, ...rest } = r
  return { ...rest, upstream: upstream.origin + upstream.basePath }
}

/** The route fields only the configuration file sets (src/rules/credentials.ts applies them by route name). */
export const fileOnlyFields = ['upstream_headers', 'upstream_tls', 'forward_authorization'] as const

/**
 * A stored route without `forward_authorization`: versions seeded before it became file-only
 * carry it (with its default written out), and it is the file's, whatever they say.
 * Anything else is returned as stored, so validation still refuses it.
 */
export function withoutStoredForwarding(rule: RawRule): RawRule {
  if (kindOf(rule) !== 'route' || !Object.hasOwn(rule, 'forward_authorization')) return rule
  const { forward_authorization: _ignored, ...rest } = rule
  return rest as RawRule
}

/**
 * A rule with its defaults made explicit, as it is stored: two spellings of
 * one rule (`30s` and `30000`, a default left out or written) compare equal.
 * A rule that does not validate on its own is returned as given.
 */
export function normalizeRule(rule: RawRule): RawRule {
  if (kindOf(rule) === 'entity') {
    const parsed = entityRuleSchema.safeParse(rule)
    return parsed.success ? entityRuleToRule(parsed.data) : rule
  }
  const parsed = routeSchema.safeParse(rule)
  if (!parsed.success) return rule
  // Kept when present so that validation still names them.
  const kept = Object.fromEntries(fileOnlyFields.filter((k) => Object.hasOwn(rule, k)).map((k) => [k, rule[k]]))
  return { ...routeToRule(parsed.data), ...kept }
}

/** The canonical raw form of a validated entity rule (defaults made explicit). */
export function entityRuleToRule(r: EntityRuleConfig): RawRule {
  return { ...r }
}
