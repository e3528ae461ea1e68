import type { Db } from '../store/db.js'
import { FencegateError } from '../http/problems.js'
import { kindOf, normalizeRule, withoutStoredForwarding, type RawRule, type RuleKind } from './schema.js'

/** The channel every rule change is announced on; the payload is the new version. */
export const rulesChannel = 'fencegate_rules'

// Serialises rule changes so versions are assigned in commit order ("fence" + 1 in ASCII digits).
const rulesLock = '435761784166'

/** The current rule set: the newest row of every name that is not deleted, as of one version. */
export interface StoredRules {
  version: number
  rules: RawRule[]
}

/** One entry of a rule's history, newest first. */
export interface RuleChange {
  version: number
  name: string
  kind: RuleKind
  /** The rule as it was set; null records a deletion. */
  rule: RawRule | null
  changed_by: string | null
  changed_at: string
  source: 'api' | 'config'
}

interface CurrentRow { top: string; name: string | null; rule: string | null }

/**
 * Reads the current rules and their version in one statement, so both come from one snapshot.
 * A stored `forward_authorization` is left out: it is the file's alone (src/rules/credentials.ts).
 */
export async function readRules(db: Db): Promise<StoredRules> {
  const rows = await db.sql<CurrentRow>`
    SELECT t.top::text AS top, l.name, l.rule::text AS rule
    FROM (SELECT coalesce(max(version), 0) AS top FROM fg_rule_versions) t
    LEFT JOIN (
      SELECT DISTINCT ON (name) name, rule FROM fg_rule_versions ORDER BY name, version DESC
    ) l ON l.rule IS NOT NULL
    ORDER BY l.name`
  return {
    version: Number(rows[0]?.top ?? 0),
    rules: rows.flatMap((r) => (r.rule === null ? [] : [withoutStoredForwarding(JSON.parse(r.rule) as RawRule)])),
  }
}

/** The newest version number: what the periodic check compares with the one in use. */
export async function readRulesVersion(db: Db): Promise<number> {
  const [row] = await db.sql<{ version: string }>`SELECT coalesce(max(version), 0)::text AS version FROM fg_rule_versions`
  return Number(row!.version)
}

export interface RuleChangeRequest {
  name: string
  /** The new rule, or null to delete the rule of that name. */
  rule: RawRule | null
  changedBy: string | null
  source: 'api' | 'config'
  /** Refuse the change unless the current version is this one (an `If-Match` from the client). */
  expectedVersion?: number
  /** Validates the whole rule set the change would produce; throws to refuse it. */
  validate(rules: RawRule[]): void
}

/** What a change did: `changed` is false when the rule was already exactly so. */
export interface RuleChangeResult {
  version: number
  changed: boolean
  /** The rule as stored (defaults explicit), or null after a deletion. */
  rule: RawRule | null
}

/**
 * Changes one rule under a transaction lock: the candidate set is built from
 * the rules as committed (never from a gateway's cache), validated as a whole,
 * written as a new version and announced with NOTIFY, which PostgreSQL
 * delivers only after the commit. Two concurrent changes are serialised, so a
 * cross-rule check (two routes matching one request) cannot be raced.
 */
export async function changeRule(db: Db, c: RuleChangeRequest): Promise<RuleChangeResult> {
  return db.begin(async (tx) => {
    await tx.sql`SELECT pg_advisory_xact_lock(${rulesLock}::bigint)`
    const current = await readRules(tx)
    if (c.expectedVersion !== undefined && c.expectedVersion !== current.version) {
      throw new FencegateError('rules_version_conflict', `the rules are at version ${current.version}, not ${c.expectedVersion}`, { version: current.version })
    }
    const existing = current.rules.find((r) => r.name === c.name)
    if (c.rule === null && !existing) throw new FencegateError('not_found', `no rule named ${c.name}`)
    const rule = c.rule === null ? null : normalizeRule(c.rule)
    if (rule !== null && existing && canonical(normalizeRule(existing)) === canonical(rule)) return { version: current.version, changed: false, rule: existing }
    const candidates = current.rules.filter((r) => r.name !== c.name)
    if (rule !== null) candidates.push(rule)
    c.validate(candidates)
    const version = current.version + 1
    const kind = kindOf(rule ?? existing!)
    await tx.sql`
      INSERT INTO fg_rule_versions (version, name, kind, rule, changed_by, source)
      VALUES (${version}::bigint, ${c.name}, ${kind}, ${rule === null ? null : JSON.stringify(rule)}::text::jsonb, ${c.changedBy}, ${c.source})`
    await tx.sql`SELECT pg_notify(${rulesChannel}, ${String(version)})`
    return { version, changed: true, rule }
  })
}

/**
 * Seeds rules from the configuration file. A name the database has never seen
 * is inserted; a name whose newest version also came from the file is updated
 * when the file says something else, so editing the file and restarting works.
 * A name an operator changed or deleted through the API is left as the
 * database has it: restarting an instance never undoes an incident change.
 * Returns the names written.
 */
export async function seedRules(db: Db, seeds: RawRule[], validate: (rules: RawRule[]) => void): Promise<string[]> {
  return db.begin(async (tx) => {
    await tx.sql`SELECT pg_advisory_xact_lock(${rulesLock}::bigint)`
    const latest = new Map((await tx.sql<{ name: string; source: string; rule: string | null }>`
      SELECT DISTINCT ON (name) name, source, rule::text AS rule FROM fg_rule_versions ORDER BY name, version DESC`).map((r) => [r.name, r]))
    const writes = seeds.filter((seed) => {
      const row = latest.get(seed.name)
      return !row || (row.source === 'config' && row.rule !== null && canonical(normalizeRule(JSON.parse(row.rule) as RawRule)) !== canonical(seed))
    })
    if (writes.length === 0) return []
    const current = await readRules(tx)
    const names = new Set(writes.map((w) => w.name))
    validate([...current.rules.filter((r) => !names.has(r.name)), ...writes])
    let version = current.version
    for (const rule of writes) {
      version++
      await tx.sql`
        INSERT INTO fg_rule_versions (version, name, kind, rule, changed_by, source)
        VALUES (${version}::bigint, ${rule.name}, ${kindOf(rule)}, ${JSON.stringify(rule)}::text::jsonb, NULL, 'config')`
    }
    await tx.sql`SELECT pg_notify(${rulesChannel}, ${String(version)})`
    return writes.map((r) => r.name)
  })
}

interface HistoryRow { version: string; name: string; kind: RuleKind; rule: string | null; changed_by: string | null; changed_at: string; source: 'api' | 'config' }

/** A rule's changes, newest first. */
export async function ruleHistory(db: Db, name: string, limit: number): Promise<RuleChange[]> {
  const rows = await db.sql<HistoryRow>`
    SELECT version::text AS version, name, kind, rule::text AS rule, changed_by,
           to_char(changed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS changed_at, source
    FROM fg_rule_versions WHERE name = ${name}
    ORDER BY fg_rule_versions.version DESC LIMIT ${limit}` // the bigint column, not the text alias
  return rows.map((r) => ({ ...r, version: Number(r.version), rule: r.rule === null ? null : JSON.parse(r.rule) as RawRule }))
}

/** JSON with sorted keys: two spellings of one rule compare equal. */
export function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`
  if (value && typeof value === 'object') {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonical((value as Record<string, unknown>)[k])}`).join(',')}}`
  }
  return JSON.stringify(value) ?? 'null'
}
