import type { HeaderView } from './exchange.js'
import { ambiguousField, isFormBody, parseFormBody } from './form-body.js'
import { pathKey, scanJson } from './json-reading.js'
import { FencegateError } from './problems.js'

/**
 * The one reading of a body that a route decides on (its entity, key or claimed tenant reads
 * it), taken as a mainstream upstream would take it, or refused where one could read it
 * otherwise. The gateway decodes nothing it would then have to forward differently: a
 * `Content-Encoding` other than `identity` and a charset other than UTF-8 are refused (415),
 * and so are bytes that are not UTF-8, JSON that strict parsing (RFC 8259) rejects, a key named
 * twice, and a form that is JSON or does not start with a field name (400, `unreadable_body`).
 * A body that is not a form is read as JSON, whatever its Content-Type says: upstreams that
 * read JSON regardless of it read it so. An empty body names nothing.
 */
export interface BodyFields {
  /**
   * The value at a path: a string, or an integer written as one (`42`, not `42.0`), as text;
   * undefined when absent. Refuses (`unreadable_body`) `null` (an upstream may take it for
   * absent or for a value), a value of another kind, a
   * form field given twice, and a key that is absent but present in another case
   * (`TENANT_ID` for `tenant_id`), which Go's and ASP.NET's readers take for it.
   */
  at(path: readonly string[]): string | undefined
  /**
   * The parsed JSON value of a JSON body, for a reader that needs its shape (is it one object,
   * is a member a string) rather than a field's text: the MCP seam (src/gateway/mcp.ts), which
   * so parses the body once. Undefined for a form and for an empty body. The strict reading's
   * checks hold for it (UTF-8, RFC 8259, no key twice); it is read-only by convention.
   */
  readonly json?: unknown
}

const nothing: BodyFields = { at: () => undefined }
// Reused: a fatal decoder keeps no state between whole (non-streaming) decodes.
const utf8 = new TextDecoder('utf-8', { fatal: true })

/**
 * Reads a body's fields for a route's decision, or refuses it.
 *
 * @example readBodyFields(new Headers({ 'content-type': 'application/json' }), bytes).at(['tenant_id']) // 'A'
 */
export function readBodyFields(headers: HeaderView, bytes: Uint8Array): BodyFields {
  if (bytes.byteLength === 0) return nothing
  const type = headers.get('content-type')
  refuseUnreadableFraming(headers.get('content-encoding'), type)
  let text: string
  try {
    text = utf8.decode(bytes)
  } catch {
    throw unreadable('the body is not UTF-8')
  }
  return isFormBody(type) ? formFields(text) : jsonFields(text)
}

/** A body only an upstream could decode, or that is not JSON or a form, is refused where the route reads it. */
function refuseUnreadableFraming(encoding: string | null, type: string | null): void {
  if (encoding !== null && encoding.trim().toLowerCase() !== 'identity') {
    throw new FencegateError('unsupported_media_type', `the route reads the body, and a body in Content-Encoding ${JSON.stringify(encoding)} is not read; send it unencoded`)
  }
  if (type?.trimStart().toLowerCase().startsWith('multipart/')) throw new FencegateError('unsupported_media_type', 'the route reads the body, and a multipart body is not read; send it as JSON or as a form')
  const charset = /;\s*charset\s*=\s*"?([^";\s]*)/i.exec(type ?? '')?.[1]?.toLowerCase()
  if (charset !== undefined && charset !== 'utf-8' && charset !== 'utf8') {
    throw new FencegateError('unsupported_media_type', `the route reads the body, and a body in charset ${JSON.stringify(charset)} is not read; send it as UTF-8`)
  }
}

function jsonFields(text: string): BodyFields {
  let root: unknown
  try {
    root = JSON.parse(text)
  } catch {
    throw unreadable('the body is neither a form nor strict JSON (RFC 8259: no comments, NaN, single quotes or trailing commas)')
  }
  const noncanonical = scanJson(text)
  return {
    json: root,
    at(path) {
      const node = walk(root, path)
      if (typeof node === 'number') {
        if (!Number.isSafeInteger(node) || noncanonical.has(pathKey(path))) throw unreadable(`body.${path.join('.')} is a number an upstream may read otherwise; send an integer up to 2^53 written plainly, or a string`)
        return String(node)
      }
      return valueOf(node, path)
    },
  }
}

function formFields(text: string): BodyFields {
  const start = text.replace(/^[\s\uFEFF]+/, '')[0]
  if (start === '{' || start === '[') throw unreadable('the body is declared as a form but is JSON; send it as Content-Type: application/json')
  if (!/^[A-Za-z0-9_%.-]/.test(text)) throw unreadable('the form body does not start with a field name')
  if (text.includes('\u0000')) throw unreadable('the form body contains a NUL byte')
  const root = parseFormBody(text)
  if (Object.hasOwn(root, '_method')) throw unreadable('the form names _method, which some upstreams take for another HTTP method')
  return { at: (path) => valueOf(walk(root, path), path) }
}

function valueOf(node: unknown, path: readonly string[]): string | undefined {
  if (node === undefined) return undefined
  if (typeof node === 'string') return node
  if (node === ambiguousField) throw unreadable(`body.${path.join('.')} is given more than once; which one counts is ambiguous`)
  throw unreadable(`body.${path.join('.')} is not a string or an integer`)
}

/** The node at a path, refusing a step that exists only in another case. */
function walk(root: unknown, path: readonly string[]): unknown {
  let node = root
  for (const [i, key] of path.entries()) {
    if (node === ambiguousField) throw unreadable(`body.${path.slice(0, i).join('.')} is given more than once; which one counts is ambiguous`)
    if (node === null || typeof node !== 'object') return undefined
    const folded = fold(key)
    const other = Object.keys(node).find((k) => k !== key && fold(k) === folded)
    if (other !== undefined) throw unreadable(`the body names ${JSON.stringify(other)} beside or instead of ${JSON.stringify(key)}; readers that match names in any case could take either`)
    if (!Object.hasOwn(node, key)) return undefined
    node = (node as Record<string, unknown>)[key]
  }
  return node
}

/** Case folding as lenient readers match names (Go folds the Kelvin sign to k, ſ to s): over-approximated, since it only refuses. */
function fold(name: string): string {
  return /^[\x00-\x7f]*$/.test(name) ? name.toLowerCase() : name.normalize('NFKC').toLowerCase()
}

function unreadable(detail: string): FencegateError {
  return new FencegateError('unreadable_body', detail)
}
