const sizeUnits: Record<string, number> = { '': 1, b: 1, kb: 1000, kib: 1024, mb: 1000 ** 2, mib: 1024 ** 2, gb: 1000 ** 3, gib: 1024 ** 3 }
const durationUnits: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }

/**
 * Parses a byte size such as `1MiB`, `512kb` or `1048576`; returns undefined when malformed.
 *
 * @example parseSize('1MiB') // 1048576
 */
export function parseSize(input: string | number): number | undefined {
  if (typeof input === 'number') return Number.isSafeInteger(input) && input >= 0 ? input : undefined
  const m = /^\s*(\d+)\s*([a-z]*)\s*$/i.exec(input)
  const unit = m && sizeUnits[m[2]!.toLowerCase()]
  if (!m || unit == null) return undefined
  const bytes = Number(m[1]) * unit
  return Number.isSafeInteger(bytes) ? bytes : undefined
}

/**
 * Parses a duration such as `30s`, `1h`, `250ms`; a bare number is milliseconds.
 *
 * @example parseDuration('1h') // 3600000
 */
export function parseDuration(input: string | number): number | undefined {
  if (typeof input === 'number') return Number.isSafeInteger(input) && input >= 0 ? input : undefined
  const m = /^\s*(\d+)\s*(ms|s|m|h|d)?\s*$/.exec(input)
  if (!m) return undefined
  const ms = Number(m[1]) * durationUnits[m[2] ?? 'ms']!
  return Number.isSafeInteger(ms) ? ms : undefined
}
