import { FencegateError } from './problems.js'

/**
 * What a JSON text says beyond what `JSON.parse` keeps, read in one pass over a text
 * `JSON.parse` accepted: a key named twice in one object is refused (`JSON.parse` keeps the
 * last of them, other parsers the first, and some refuse), and the paths of numbers written
 * in another form than a plain integer (`42.0`, `4.2e1`, `-0`) are returned, so that a
 * template reading one of them as an id can refuse it: `JSON.parse` reads `42.0` as 42,
 * while an upstream may read the float 42.0, the text "42.0", or refuse it. Keys are
 * compared as parsed, so `"a"` and `"\u0061"` are the same key.
 *
 * @example scanJson('{"id":42.0}').has(pathKey(['id'])) // true
 * @example scanJson('{"tenant_id":"B","tenant_id":"A"}') // throws unreadable_body
 */
export function scanJson(text: string): Set<string> {
  const noncanonical = new Set<string>()
  // One frame per open container: an object's keys and current key, or an array's index.
  const stack: { keys: Set<string> | null; key: string; index: number }[] = []
  let expectKey = false
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c === 0x7b || c === 0x5b) {
      stack.push({ keys: c === 0x7b ? new Set() : null, key: '', index: 0 })
      expectKey = c === 0x7b
    } else if (c === 0x7d || c === 0x5d) {
      stack.pop()
      expectKey = false
    } else if (c === 0x2c) {
      const top = stack[stack.length - 1]!
      if (top.keys) expectKey = true
      else top.index++
    } else if (c === 0x22) {
      const end = stringEnd(text, i)
      if (expectKey) {
        const top = stack[stack.length - 1]!
        const raw = text.slice(i + 1, end)
        const key = raw.includes('\\') ? JSON.parse(text.slice(i, end + 1)) as string : raw
        if (top.keys!.has(key)) throw new FencegateError('unreadable_body', 'the JSON body names a key twice in one object; which one counts is ambiguous')
        top.keys!.add(key)
        top.key = key
        expectKey = false
      }
      i = end
    } else if (c === 0x2d || (c >= 0x30 && c <= 0x39)) {
      // JSON.parse accepted the text, so the number is well formed: it is a plain integer
      // unless it has a fraction or an exponent, or is -0.
      let end = i + 1
      let plain = true
      for (; end < text.length; end++) {
        const d = text.charCodeAt(end)
        if (d >= 0x30 && d <= 0x39) continue
        if (d !== 0x2e && d !== 0x65 && d !== 0x45 && d !== 0x2b && d !== 0x2d) break
        plain = false
      }
      if (!plain || (c === 0x2d && end === i + 2 && text.charCodeAt(i + 1) === 0x30)) noncanonical.add(pathKey(stack.map((f) => (f.keys ? f.key : String(f.index)))))
      i = end - 1
    }
  }
  return noncanonical
}

/** The key `scanJson` files a path under. */
export function pathKey(path: readonly string[]): string {
  return path.join('\u0000')
}

/** The index of the quote that closes the string opening at `start`. */
function stringEnd(text: string, start: number): number {
  for (let i = start + 1; i < text.length; i++) {
    if (text[i] === '\\') i++
    else if (text[i] === '"') return i
  }
  return text.length - 1
}
