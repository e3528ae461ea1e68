/**
 * Reads an `application/x-www-form-urlencoded` body in bracket notation, as
 * Stripe's API and PHP/Rails-style forms send it, into the tree an entity
 * template walks: `metadata[external_id]=c_9` is `body.metadata.external_id`,
 * `items[0][price]=p_1` is `body.items.0.price`. A name given twice, or used
 * both as a value and as a parent (`a=1&a[b]=2`), is ambiguous: reading it (or
 * below it) is refused (src/http/body-fields.ts) rather than guessing which one
 * the upstream will use.
 */

/** Stands for an ambiguous name; not a string and not an object, so it never resolves to a value. */
export const ambiguousField = Symbol('ambiguous form field')
const ambiguous = ambiguousField
type FormNode = string | typeof ambiguous | FormTree
export interface FormTree { [key: string]: FormNode }

/** True for `application/x-www-form-urlencoded`, with or without parameters such as `charset`. */
export function isFormBody(contentType: string | null): boolean {
  return contentType?.split(';')[0]!.trim().toLowerCase() === 'application/x-www-form-urlencoded'
}

/**
 * Parses a form body's text into nested null-prototype objects of strings
 * (src/http/body-fields.ts decodes and checks the bytes first).
 *
 * @example parseFormBody('metadata[external_id]=c_9') // { metadata: { external_id: 'c_9' } }
 */
export function parseFormBody(text: string): FormTree {
  const root: FormTree = Object.create(null)
  for (const [name, value] of new URLSearchParams(text)) {
    const path = fieldPath(name)
    if (path) insert(root, path, value)
  }
  return root
}

/** `a[b][0]` → ['a', 'b', '0']; undefined for a name that is not bracket notation. */
function fieldPath(name: string): string[] | undefined {
  const m = /^([^[\]]+)((?:\[[^[\]]*\])*)$/.exec(name)
  if (!m) return undefined
  return [m[1]!, ...[...m[2]!.matchAll(/\[([^[\]]*)\]/g)].map((s) => s[1]!)]
}

function insert(root: FormTree, path: string[], value: string): void {
  let node = root
  for (let i = 0; i < path.length - 1; i++) {
    const key = path[i]!
    const next = Object.hasOwn(node, key) ? node[key]! : (node[key] = Object.create(null) as FormTree)
    if (typeof next !== 'object') {
      node[key] = ambiguous
      return
    }
    node = next
  }
  const last = path[path.length - 1]!
  node[last] = Object.hasOwn(node, last) ? ambiguous : value
}
