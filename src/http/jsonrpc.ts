/**
 * JSON-RPC 2.0 as an MCP route answers in it (src/gateway/mcp.ts): a refusal as an error answer
 * to the message's own `id`, and a stored answer given to a duplicate with the duplicate's `id`.
 * Plain functions over values and text; no other module of fencegate is needed here.
 */

/** A JSON-RPC request id: a string or a number; `null` when the message's id could not be read. */
export type RpcId = string | number | null

/**
 * The `error.code` of a refusal: `-32600` (Invalid Request) for a message that cannot be read
 * or is not one JSON-RPC request, `-32602` (Invalid params) for a fence, key or entity the
 * message names wrongly, and `-32080` for every decision fencegate made about a well-formed
 * message (a stale fence, a reused key, a store that is down...). `-32080` is in the server
 * range and away from the codes the MCP SDKs use themselves (`-32000` is the 1.x SDK's
 * ConnectionClosed, `-32001` its RequestTimeout, `-32020` the 2.x header mismatch): clients
 * branch on `error.data.code`, fencegate's code, not on this number.
 *
 * @example rpcErrorCode('stale_fence') // -32080
 */
export function rpcErrorCode(code: string): number {
  if (invalidRequest.has(code)) return invalidRequestCode
  if (invalidParams.has(code)) return -32602
  return fencegateRefusal
}

/** JSON-RPC's Invalid Request: a message that cannot be read or is not one request. */
export const invalidRequestCode = -32600
/** The `error.code` of fencegate's decisions about well-formed messages. */
export const fencegateRefusal = -32080
const invalidRequest = new Set(['invalid_request', 'unreadable_body', 'unsupported_media_type', 'body_too_large'])
const invalidParams = new Set(['entity_unresolved', 'invalid_fence', 'invalid_idempotency_key', 'idempotency_key_required'])

/** What an error answer is built from: the problem's members (RFC 9457 and fencegate's extras). */
export interface RpcProblem {
  code: string
  detail: string
  /** The problem's members as problem+json would carry them: type, title, status, detail, code, request_id and extras. */
  members: Record<string, unknown>
}

/**
 * A JSON-RPC error answer: `error.message` is `<code>: <detail>` (what a model reads),
 * `error.data` the problem's members, `data.code` fencegate's code.
 *
 * @example
 * rpcErrorBody(7, { code: 'stale_fence', detail: 'fence 3 is lower than 5', members })
 * // {"jsonrpc":"2.0","id":7,"error":{"code":-32080,"message":"stale_fence: fence 3 is lower than 5","data":{...}}}
 */
export function rpcErrorBody(id: RpcId, p: RpcProblem): string {
  return JSON.stringify({ jsonrpc: '2.0', id, error: { code: rpcErrorCode(p.code), message: `${p.code}: ${p.detail}`, data: p.members } })
}

/**
 * A refused `tools/call` as a tool result (`mcp_refusals: tool_error`): `isError: true`, the
 * code and detail as text for the model, the problem's members (fencegate's `code` among them)
 * as `structuredContent`. `resultType: "complete"` is added on protocol 2026-07-28 and later,
 * whose clients reject a result without it; earlier protocols' results have none.
 *
 * @example
 * rpcToolErrorBody(7, { code: 'stale_fence', detail: 'fence 3 is lower than 5', members }, false)
 * // {"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"stale_fence: ..."}],"structuredContent":{...},"isError":true}}
 */
export function rpcToolErrorBody(id: Exclude<RpcId, null>, p: RpcProblem, resultType: boolean): string {
  const result = { content: [{ type: 'text', text: `${p.code}: ${p.detail}` }], structuredContent: p.members, isError: true, ...(resultType ? { resultType: 'complete' } : {}) }
  return JSON.stringify({ jsonrpc: '2.0', id, result })
}

/**
 * The protocol versions whose results carry `resultType` (MCP 2026-07-28 on): versions are
 * dates, so they compare as text.
 *
 * @example resultTypeRequired('2026-07-28') // true
 */
export function resultTypeRequired(protocolVersion: string | null | undefined): boolean {
  return typeof protocolVersion === 'string' && /^\d{4}-\d{2}-\d{2}$/.test(protocolVersion) && protocolVersion >= '2026-07-28'
}

/**
 * A stored answer with another request's id: the top-level `id` of a JSON answer, or of each
 * `data:` line of an event stream that is a response (it has an `id` and no `method`: the
 * server's own requests keep theirs); every other byte as stored. An answer it cannot read
 * is returned as it is.
 *
 * @example withRpcId(new TextEncoder().encode('{"result":{},"jsonrpc":"2.0","id":1}'), 'application/json', 9) // '{"result":{},"jsonrpc":"2.0","id":9}'
 */
export function withRpcId(body: Uint8Array, contentType: string | null, id: Exclude<RpcId, null>): Uint8Array {
  let text: string
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(body)
  } catch {
    return body
  }
  const spliced = contentType?.toLowerCase().startsWith('text/event-stream')
    ? text.split(/(\r\n|\r|\n)/).map((line) => eventLineWithId(line, id)).join('')
    : responseWithId(text, id)
  return spliced === text ? body : new TextEncoder().encode(spliced)
}

function eventLineWithId(line: string, id: Exclude<RpcId, null>): string {
  if (!line.startsWith('data:')) return line
  const at = line.startsWith('data: ') ? 6 : 5
  return line.slice(0, at) + responseWithId(line.slice(at), id)
}

/** The text of one JSON-RPC response with its top-level id replaced; anything else unchanged. */
function responseWithId(text: string, id: Exclude<RpcId, null>): string {
  const members = topLevelMembers(text)
  const at = members?.get('id')
  if (!at || members!.has('method')) return text
  return text.slice(0, at[0]) + JSON.stringify(id) + text.slice(at[1])
}

/** Where each top-level member's value starts and ends in a JSON object's text; undefined when it is not one. */
function topLevelMembers(text: string): Map<string, [number, number]> | undefined {
  let i = skipSpace(text, 0)
  if (text[i] !== '{') return undefined
  const members = new Map<string, [number, number]>()
  i = skipSpace(text, i + 1)
  if (text[i] === '}') return members
  for (;;) {
    if (text[i] !== '"') return undefined
    const keyEnd = stringEnd(text, i)
    let key: unknown
    try {
      key = JSON.parse(text.slice(i, keyEnd))
    } catch {
      return undefined
    }
    i = skipSpace(text, keyEnd)
    if (text[i] !== ':') return undefined
    const start = skipSpace(text, i + 1)
    i = valueEnd(text, start)
    members.set(String(key), [start, i])
    i = skipSpace(text, i)
    if (text[i] === '}') return members
    if (text[i] !== ',') return undefined
    i = skipSpace(text, i + 1)
  }
}

function skipSpace(text: string, i: number): number {
  while (i < text.length && (text[i] === ' ' || text[i] === '\t' || text[i] === '\n' || text[i] === '\r')) i++
  return i
}

/** The index after a string that starts at `i` (its opening quote). */
function stringEnd(text: string, i: number): number {
  for (let j = i + 1; j < text.length; j++) {
    if (text[j] === '\\') j++
    else if (text[j] === '"') return j + 1
  }
  return text.length
}

/** The index after the value that starts at `i`. */
function valueEnd(text: string, i: number): number {
  if (text[i] === '"') return stringEnd(text, i)
  if (text[i] === '{' || text[i] === '[') {
    let depth = 0
    for (let j = i; j < text.length; j++) {
      const c = text[j]
      if (c === '"') j = stringEnd(text, j) - 1
      else if (c === '{' || c === '[') depth++
      else if ((c === '}' || c === ']') && --depth === 0) return j + 1
    }
    return text.length
  }
  let j = i
  while (j < text.length && !',}] \t\r\n'.includes(text[j]!)) j++
  return j
}
