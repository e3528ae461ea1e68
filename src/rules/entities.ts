import type { EntityRuleConfig } from '../config/schema.js'
import { globMatches } from './glob.js'

/** An entity rule ready to match: its pattern's matcher and its specificity. */
export interface CompiledEntityRule {
  config: EntityRuleConfig
  matches: (entity: string) => boolean
  /** Characters other than `*`: a longer literal part is a more specific pattern. */
  specificity: number
}

/** What the entity rules say about one entity of one tenant. */
export interface EntityPolicy {
  /** The name of a rule that freezes the entity, if any. */
  frozenBy?: string
  fence?: 'required' | 'optional' | 'off'
  ordering?: 'none' | 'serialize'
}

/**
 * Compiles `entity_match` globs (`*` is any run of characters, everything else literal), most
 * specific first. A glob is matched in linear time (src/rules/glob.ts), never as a regular
 * expression: an operator's pattern meets clients' entities, and a backtracking one blocked the
 * event loop for minutes on a 128-character entity.
 */
export function compileEntityRules(rules: EntityRuleConfig[]): CompiledEntityRule[] {
  return rules.map((config) => {
    const pattern = config.entity_match
    const exact = !pattern.includes('*')
    return { config, matches: exact ? (e: string) => e === pattern : (e: string) => globMatches(pattern, e), specificity: pattern.replaceAll('*', '').length }
  }).sort((a, b) => b.specificity - a.specificity || (a.config.name < b.config.name ? -1 : a.config.name > b.config.name ? 1 : 0))
}

/**
 * The policy for one entity: frozen when any matching rule freezes it; each
 * override (fence, ordering) from the most specific matching rule that sets
 * it (longest literal part, then the name in code-point order).
 *
 * @example
 * entityPolicy(compileEntityRules([{ name: 'f', entity_match: 'invoice:*', frozen: true }]), 'acme', 'invoice:42') // { frozenBy: 'f' }
 */
export function entityPolicy(rules: CompiledEntityRule[], tenant: string, entity: string): EntityPolicy {
  const policy: EntityPolicy = {}
  for (const r of rules) {
    if ((r.config.tenant !== undefined && r.config.tenant !== tenant) || !r.matches(entity)) continue
    if (r.config.frozen && policy.frozenBy === undefined) policy.frozenBy = r.config.name
    if (r.config.fence !== undefined && policy.fence === undefined) policy.fence = r.config.fence
    if (r.config.ordering !== undefined && policy.ordering === undefined) policy.ordering = r.config.ordering
  }
  return policy
}

/**
 * The name of a rule freezing, for `tenant`, an entity that starts with `prefix` (the literal
 * start of a route's entity template), or undefined. For a command whose entity does not
 * resolve: it could be about a frozen entity, so it is not let through unchecked.
 *
 * @example
 * freezeThatCouldApply(compileEntityRules([{ name: 'f', entity_match: 'invoice:42', frozen: true }]), 'acme', 'invoice:') // 'f'
 */
export function freezeThatCouldApply(rules: CompiledEntityRule[], tenant: string, prefix: string): string | undefined {
  for (const r of rules) {
    if (!r.config.frozen || (r.config.tenant !== undefined && r.config.tenant !== tenant)) continue
    const literal = r.config.entity_match.split('*')[0]!
    if (literal.startsWith(prefix) || prefix.startsWith(literal)) return r.config.name
  }
  return undefined
}
