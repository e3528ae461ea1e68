/**
 * Field-by-field differences between two versions of a rule: what
 * `fencegate rules apply --dry-run` prints and what the console's rules view
 * shows. Pure, so the browser bundle can use it too.
 */

/** One field that differs; `undefined` means the field is absent on that side. */
export interface FieldChange {
  field: string
  old: unknown
  new: unknown
}

/** Key-order-independent JSON, so `{a,b}` equals `{b,a}`. */
export function canonicalJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`
  if (value && typeof value === 'object') {
    return `{${Object.keys(value).sort().map((k) => `${JSON.stringify(k)}:${canonicalJson((value as Record<string, unknown>)[k])}`).join(',')}}`
  }
  return JSON.stringify(value) ?? 'null'
}

/**
 * The fields whose values differ between two rule objects, sorted by name.
 *
 * @example
 * diffRule({ timeout_ms: 5000 }, { timeout_ms: 2500 }) // [{ field: 'timeout_ms', old: 5000, new: 2500 }]
 */
export function diffRule(before: Record<string, unknown>, after: Record<string, unknown>): FieldChange[] {
  const fields = [...new Set([...Object.keys(before), ...Object.keys(after)])].sort()
  return fields
    .filter((f) => (before[f] === undefined ? undefined : canonicalJson(before[f])) !== (after[f] === undefined ? undefined : canonicalJson(after[f])))
    .map((f) => ({ field: f, old: before[f], new: after[f] }))
}

/** A value as a plan shows it: JSON, or `(unset)` when the field is absent. */
export function showValue(value: unknown): string {
  return value === undefined ? '(unset)' : canonicalJson(value)
}
