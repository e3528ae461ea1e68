/**
 * `${VAR}` expansion. Placeholders are swapped in before YAML parsing and the
 * values after it, so a variable can stand anywhere a scalar can (even inside a
 * flow mapping such as `{ url: ${DATABASE_URL} }`) and a value can never inject
 * YAML structure. `${VAR:-default}` allows an unset variable; a plain `${VAR}`
 * that is unset is an error, never a silent empty string.
 */
const reference = /\$\{([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?\}/g

export interface Expansion {
  text: string
  restore(value: unknown, path?: string): unknown
}

export class ExpansionError extends Error {
  override name = 'ExpansionError'
}

export function prepareExpansion(text: string, env: Record<string, string | undefined>): Expansion {
  const token = `fgvar${Math.random().toString(36).slice(2, 10)}x`
  const values: { name: string; value: string | undefined }[] = []
  const prepared = text.replace(reference, (_all, name: string, hasDefault: string | undefined, fallback: string | undefined) => {
    // As in a shell, `:-` also replaces a variable that is set but empty.
    const set = env[name]
    const value = hasDefault && !set ? (fallback ?? '') : set
    values.push({ name, value })
    return `${token}${values.length - 1}${token}`
  })
  const placeholder = new RegExp(`${token}(\\d+)${token}`, 'g')
  const restore = (value: unknown, path = ''): unknown => {
    if (typeof value === 'string') {
      return value.replace(placeholder, (_all, i: string) => {
        const ref = values[Number(i)]!
        if (ref.value === undefined) {
          throw new ExpansionError(`${path || '(root)'}: environment variable ${ref.name} is not set (write \${${ref.name}:-} to allow it to be empty)`)
        }
        return ref.value
      })
    }
    if (Array.isArray(value)) return value.map((v, i) => restore(v, `${path}[${i}]`))
    if (value && typeof value === 'object') {
      return Object.fromEntries(Object.entries(value).map(([k, v]) => {
        const key = restore(k, path) as string
        return [key, restore(v, path ? `${path}.${key}` : key)]
      }))
    }
    return value
  }
  return { text: prepared, restore }
}
