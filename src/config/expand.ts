/**
 * `${VAR}` and `${file:/path}` expansion. Placeholders are swapped in before YAML parsing and
 * the values after it, so a reference can stand anywhere a scalar can (even inside a flow
 * mapping such as `{ url: ${DATABASE_URL} }`) and a value can never inject YAML structure.
 * `${VAR:-default}` allows an unset variable; a plain `${VAR}` that is unset is an error,
 * never a silent empty string. `${file:/run/secrets/db_url}` is the file's content without
 * one trailing newline (`\n` or `\r\n`, as `echo` and editors leave one): how Kubernetes,
 * Docker and systemd (`LoadCredential=`) hand out secrets. Its path may start with a
 * variable, `${file:${CREDENTIALS_DIRECTORY}/db_url}`. A file that cannot be read is an
 * error naming the field and the path, never its content.
 */
const reference = /\$\{(?:file:((?:\$\{[A-Za-z_][A-Za-z0-9_]*\}|[^}$])+)|([A-Za-z_][A-Za-z0-9_]*)(:-([^}]*))?)\}/g
const inPath = /\$\{([A-Za-z_][A-Za-z0-9_]*)\}/g

export interface Expansion {
  text: string
  restore(value: unknown, path?: string): unknown
}

export class ExpansionError extends Error {
  override name = 'ExpansionError'
}

/**
 * Reads a file's text; throws (with a `code` such as `ENOENT`) when it cannot. The runtime
 * that can read files passes one (src/config/load.ts); without it `${file:…}` is an error.
 */
export type ReadTextFile = (path: string) => string

/** One reference of the text: a variable (its value, undefined when unset) or a file, read when restored. */
type Reference = { name: string; value: string | undefined } | { file: string }

/**
 * Swaps every reference of `text` for a placeholder; `restore` puts the values back into the
 * parsed YAML, naming the field of any reference that cannot be resolved.
 *
 * @example
 * const e = prepareExpansion('token: ${file:/run/secrets/token}', process.env, (p) => readFileSync(p, 'utf8'))
 */
export function prepareExpansion(text: string, env: Record<string, string | undefined>, readFile?: ReadTextFile): Expansion {
  const token = `fgvar${Math.random().toString(36).slice(2, 10)}x`
  const refs: Reference[] = []
  const prepared = text.replace(reference, (_all, file: string | undefined, name: string | undefined, hasDefault: string | undefined, fallback: string | undefined) => {
    if (file !== undefined) refs.push({ file })
    else {
      // As in a shell, `:-` also replaces a variable that is set but empty.
      const set = env[name!]
      refs.push({ name: name!, value: hasDefault && !set ? (fallback ?? '') : set })
    }
    return `${token}${refs.length - 1}${token}`
  })
  const placeholder = new RegExp(`${token}(\\d+)${token}`, 'g')
  const resolve = (ref: Reference, path: string): string => {
    if ('file' in ref) return readReference(ref.file, env, readFile, path)
    if (ref.value === undefined) {
      throw new ExpansionError(`${path}: environment variable ${ref.name} is not set (write \${${ref.name}:-} to allow it to be empty)`)
    }
    return ref.value
  }
  const restore = (value: unknown, path = ''): unknown => {
    if (typeof value === 'string') return value.replace(placeholder, (_all, i: string) => resolve(refs[Number(i)]!, path || '(root)'))
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

/** A `${file:…}` reference's value: its path's variables expanded, the file read, one trailing newline dropped. */
function readReference(written: string, env: Record<string, string | undefined>, readFile: ReadTextFile | undefined, field: string): string {
  const file = written.replace(inPath, (_all, name: string) => {
    const value = env[name]
    if (value === undefined) throw new ExpansionError(`${field}: environment variable ${name} (in \${file:${written}}) is not set`)
    return value
  })
  if (!readFile) throw new ExpansionError(`${field}: \${file:${file}} cannot be read here (no file system); use a variable or a secret binding`)
  let content: string
  try {
    content = readFile(file)
  } catch (err) {
    throw new ExpansionError(`${field}: cannot read file ${file} (${(err as { code?: string } | null)?.code ?? 'error'})`)
  }
  return content.replace(/\r?\n$/, '')
}
