/**
 * Whether a JSON text names a key twice in one object. `JSON.parse` keeps the last of them,
 * other parsers the first, and some refuse: a body the gateway and the upstream read
 * differently lets a request be fenced (or tenant-checked) as one thing and executed as
 * another. Keys are compared as parsed, so `"a"` and `"\u0061"` are the same key.
 * Expects text that `JSON.parse` accepted.
 *
 * @example hasDuplicateKeys('{"tenant_id":"B","tenant_id":"A"}') // true
 */
export function hasDuplicateKeys(text: string): boolean {
  // One entry per open container: the keys of an object, or null for an array.
  const stack: (Set<string> | null)[] = []
  let expectKey = false
  for (let i = 0; i < text.length; i++) {
    const c = text[i]
    if (c === '{') {
      stack.push(new Set())
      expectKey = true
    } else if (c === '[') {
      stack.push(null)
      expectKey = false
    } else if (c === '}' || c === ']') {
      stack.pop()
      expectKey = false
    } else if (c === ',') {
      expectKey = stack[stack.length - 1] instanceof Set
    } else if (c === '"') {
      const end = stringEnd(text, i)
      if (expectKey) {
        const keys = stack[stack.length - 1] as Set<string>
        const key = JSON.parse(text.slice(i, end + 1)) as string
        if (keys.has(key)) return true
        keys.add(key)
        expectKey = false
      }
      i = end
    }
  }
  return false
}

/** The index of the quote that closes the string opening at `start`. */
function stringEnd(text: string, start: number): number {
  for (let i = start + 1; i < text.length; i++) {
    if (text[i] === '\\') i++
    else if (text[i] === '"') return i
  }
  return text.length - 1
}
