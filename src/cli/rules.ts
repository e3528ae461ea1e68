import { readFileSync } from 'node:fs'
import { ConfigError } from '../config/schema.js'
import { readExpandedYaml } from '../config/text.js'
import { kindOf, normalizeRule, RuleError, validateRuleSet, type RawRule } from '../rules/schema.js'
import { canonical, type RuleChange } from '../rules/store.js'
import { diffRule, showValue, type FieldChange } from '../rules/diff.js'
import { adminCall, AdminError } from './admin-client.js'
import { stringFlag, UsageError, type Flags } from './usage.js'

interface CurrentRules { version: number; rules: RawRule[] }

/** `fencegate rules list`: the rules in use and their version. */
export async function runRulesList(flags: Flags): Promise<number> {
  const { body } = await adminCall<CurrentRules>(flags, '/rules')
  if (flags.json) {
    console.log(JSON.stringify(body, null, 2))
    return 0
  }
  console.log(`version ${body.version}`)
  for (const r of body.rules) {
    console.log(kindOf(r) === 'route'
      ? `route   ${r.name}\t${String(r.method)} ${String(r.path)} -> ${String(r.upstream)}\tfence: ${String(r.fence ?? 'required')}`
      : `entity  ${r.name}\t${String(r.entity_match)}\t${describeEntityRule(r)}`)
  }
  return 0
}

/** `fencegate rules history NAME`: every version of one rule, newest first. */
export async function runRulesHistory(flags: Flags, name: string): Promise<number> {
  const limit = stringFlag(flags, 'limit')
  const { body } = await adminCall<{ items: RuleChange[] }>(flags, `/rules/${encodeURIComponent(name)}/history${limit ? `?limit=${encodeURIComponent(limit)}` : ''}`)
  if (flags.json) {
    console.log(JSON.stringify(body, null, 2))
    return 0
  }
  for (const c of body.items) {
    console.log([`v${c.version}`, c.changed_at, c.source, c.changed_by ?? '-', c.rule === null ? 'deleted' : canonical(c.rule)].join('\t'))
  }
  return 0
}

/** `fencegate entities bump ENTITY --to N`: raise an entity's fence floor. */
export async function runBump(flags: Flags, entity: string): Promise<number> {
  const to = stringFlag(flags, 'to')
  if (to === undefined) throw new UsageError('--to is required: the lowest fence that stays valid')
  const tenant = stringFlag(flags, 'tenant')
  const { body } = await adminCall<{ previous_fence: string | null; highest_fence: string; raised: boolean }>(
    flags, `/entities/${encodeURIComponent(entity)}/bump${tenant ? `?tenant=${encodeURIComponent(tenant)}` : ''}`, { method: 'POST', body: { min_fence: to } })
  console.log(body.raised
    ? `${entity}: fence raised from ${body.previous_fence ?? 'none'} to ${body.highest_fence}; every holder of a lower fence is now rejected`
    : `${entity}: already at ${body.highest_fence}; nothing changed`)
  return 0
}

/** Reads a rules file: `routes:` and `entity_rules:` as in the configuration file, with `${VAR}` and `${file:…}` expansion. */
export function readRulesFile(path: string, env: Record<string, string | undefined>): RawRule[] {
  let text: string
  try {
    text = readFileSync(path, 'utf8')
  } catch (err) {
    throw new UsageError(`${path}: cannot read (${(err as NodeJS.ErrnoException).code ?? 'error'})`)
  }
  let doc: unknown
  try {
    doc = readExpandedYaml(text, env, path, (file) => readFileSync(file, 'utf8'))
  } catch (err) {
    if (err instanceof ConfigError) throw new UsageError(err.problems.join('\n'))
    throw err
  }
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) throw new UsageError(`${path}: expected a mapping with routes: and entity_rules:`)
  const extra = Object.keys(doc).filter((k) => k !== 'routes' && k !== 'entity_rules')
  if (extra.length > 0) throw new UsageError(`${path}: only routes: and entity_rules: belong in a rules file, not ${extra.join(', ')}`)
  const { routes = [], entity_rules: entityRules = [] } = doc as { routes?: unknown; entity_rules?: unknown }
  if (!Array.isArray(routes) || !Array.isArray(entityRules)) throw new UsageError(`${path}: routes and entity_rules must be lists`)
  const rules = [...routes, ...entityRules] as RawRule[]
  for (const [i, r] of rules.entries()) {
    if (r === null || typeof r !== 'object' || typeof r.name !== 'string') throw new UsageError(`${path}: rule #${i + 1} needs a name`)
  }
  for (const r of entityRules as Record<string, unknown>[]) {
    if (!Object.hasOwn(r, 'entity_match')) throw new UsageError(`${path}: entity rule ${String(r.name)} needs entity_match`)
  }
  return rules
}

/** One line of the plan: what applying the file does to one rule. */
export interface PlanStep { op: 'add' | 'change' | 'delete' | 'keep'; name: string; rule?: RawRule; fields?: string[]; changes?: FieldChange[] }

/** Compares the file with the rules in use; rules only in the database are kept unless `prune`. */
export function plan(desired: RawRule[], current: RawRule[], prune: boolean): PlanStep[] {
  const now = new Map(current.map((r) => [r.name, normalizeRule(r)]))
  const steps: PlanStep[] = []
  const wanted = new Set(desired.map((r) => r.name))
  for (const r of current) if (!wanted.has(r.name)) steps.push({ op: prune ? 'delete' : 'keep', name: r.name })
  for (const given of desired) {
    const r = normalizeRule(given)
    const old = now.get(r.name)
    if (!old) steps.push({ op: 'add', name: r.name, rule: given })
    else if (canonical(old) !== canonical(r)) {
      const changes = diffRule(old, r)
      steps.push({ op: 'change', name: r.name, rule: given, fields: changes.map((c) => c.field), changes })
    }
  }
  return steps
}

/**
 * `fencegate rules apply -f FILE [--dry-run] [--prune]`: prints the diff, then
 * applies it change by change, each with `If-Match` on the version the
 * previous step produced, so a concurrent change by someone else stops it.
 */
export async function runRulesApply(flags: Flags): Promise<number> {
  const file = stringFlag(flags, 'file')
  if (!file) throw new UsageError('-f/--file is required')
  const desired = readRulesFile(file, process.env)
  try {
    // Early feedback on each rule's fields; the gateway validates the set again against its own auth mode.
    validateRuleSet(desired, 'jwt')
  } catch (err) {
    if (err instanceof RuleError) throw new UsageError(`${file}:\n  ${err.problems.join('\n  ')}`)
    throw err
  }
  const { body: current } = await adminCall<CurrentRules>(flags, '/rules')
  const steps = plan(desired, current.rules, flags.prune === true)
  const changes = steps.filter((s) => s.op !== 'keep')
  for (const s of steps) {
    if (s.op === 'add') console.log(`+ ${s.name}`)
    if (s.op === 'change') {
      console.log(`~ ${s.name}: ${s.fields!.join(', ')}`)
      for (const c of s.changes!) console.log(`    ${c.field}: ${showValue(c.old)} → ${showValue(c.new)}`)
    }
    if (s.op === 'delete') console.log(`- ${s.name}`)
    if (s.op === 'keep') console.log(`  ${s.name}: not in the file, kept (--prune deletes it)`)
  }
  console.log(`${changes.length} change(s) against version ${current.version}${flags['dry-run'] ? ' (dry run: nothing applied)' : ''}`)
  if (flags['dry-run'] || changes.length === 0) return 0
  let version = current.version
  // Deletions first, so a path can move from one rule to another in one apply.
  for (const s of [...changes.filter((c) => c.op === 'delete'), ...changes.filter((c) => c.op !== 'delete')]) {
    try {
      const { body } = await adminCall<{ version: number }>(flags, `/rules/${encodeURIComponent(s.name)}`, {
        method: s.op === 'delete' ? 'DELETE' : 'PUT', headers: { 'if-match': `"${version}"` }, ...(s.rule ? { body: s.rule } : {}),
      })
      version = body.version
    } catch (err) {
      if (err instanceof AdminError) {
        console.error(`stopped at ${s.name} (rules are at version ${version}): ${err.message}${err.problems.length ? `\n  ${err.problems.join('\n  ')}` : ''}`)
        return 1
      }
      throw err
    }
  }
  console.log(`applied: rules are at version ${version}`)
  return 0
}

function describeEntityRule(r: RawRule): string {
  const parts = [r.frozen === true ? 'frozen' : undefined, r.fence ? `fence: ${String(r.fence)}` : undefined, r.ordering ? `ordering: ${String(r.ordering)}` : undefined]
  return [...parts.filter(Boolean), r.tenant ? `tenant: ${String(r.tenant)}` : undefined].filter(Boolean).join(', ')
}
