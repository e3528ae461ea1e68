import type { Answer, HeaderView } from '../http/exchange.js'
import { readBodyFields, type BodyFields } from '../http/body-fields.js'
import type { Inbound } from '../http/inbound.js'
import { withRpcId, type RpcId } from '../http/jsonrpc.js'
import { FencegateError } from '../http/problems.js'
import { auditRejection } from './audited.js'
import type { PipelineContext } from './context.js'
import { fenceHeader, parseFence } from './fence.js'
import { idempotencyHeader, keyHeaderValue, parseIdempotencyKey } from './idempotency.js'
import type { Route } from './route.js'
import type { Trace } from './trace.js'

/**
 * The one seam where MCP enters the pipeline (issue 42): right after the route (and identity),
 * an MCP route's POST is read as ONE JSON-RPC message in the body's one strict reading, and the
 * message's rule chosen: its Route (compiled once from the route and the rule, src/gateway/route.ts)
 * becomes `trace.route`, so fence, key, reservation, forward and outcome are the REST steps.
 * What cannot be decided per message is refused, never forwarded unchecked: a batch, a body
 * that is not one object, a `tools/call` without a string `params.name`, `Mcp-Method`/`Mcp-Name`
 * headers that contradict the body. A fence and a key may also come in `params._meta`
 * (`io.fencegate/fence`, `io.fencegate/idempotency-key`); they are read here into the headers
 * the steps read, and refused when a header says otherwise.
 */

/** Where an agent puts its fence and key when it can set per-call metadata but not headers. */
export const metaFence = 'io.fencegate/fence'
export const metaKey = 'io.fencegate/idempotency-key'

/** An MCP POST as the seam read it. */
export interface McpMessage {
  /** The Route its rule compiled to, or the MCP route itself for a message no rule names. */
  route: Route
  /** The request, with a fence and key from `_meta` as the headers the steps read. */
  request: Inbound
  bytes: Uint8Array
  fields: BodyFields
  /** What a key's fingerprint hashes: method, tool and params without `_meta`; not the id (a retry has a new one). */
  payload: Uint8Array | undefined
}

type Message = Record<string, unknown> & { params?: Record<string, unknown> }

const utf8 = new TextEncoder()

/**
 * Reads an MCP route's POST and chooses its rule; records the message's id, method and tool on
 * the trace, so a refusal answers that id and logs name the tool. Refusals are audited.
 *
 * @example const m = await readMcpMessage(ctx, request, route, trace) // m.route.config.name === 'tickets-mcp/create_ticket'
 */
export async function readMcpMessage(ctx: Pick<PipelineContext, 'store' | 'log' | 'bodyLimit'>, request: Inbound, route: Route, trace: Trace): Promise<McpMessage> {
  try {
    const bytes = await request.readBody(ctx.bodyLimit)
    const fields = readBodyFields(request.headers, bytes)
    const message = oneMessage(fields)
    const id = message.id
    trace.rpc = { id: typeof id === 'string' || (typeof id === 'number' && Number.isFinite(id)) ? id : id === undefined ? undefined : null }
    if (fields.at(['jsonrpc']) !== '2.0') throw invalid('the body is not a JSON-RPC 2.0 message ("jsonrpc": "2.0")')
    const method = message.method === undefined ? undefined : fields.at(['method'])
    if (message.method !== undefined && typeof message.method !== 'string') throw invalid('the message\'s method is not a string')
    const name = method === 'tools/call' ? toolName(message, fields) : undefined
    Object.assign(trace.rpc, { method, name })
    refuseContradictingHeaders(request.headers, message, method)
    const chosen = (name !== undefined ? route.mcp!.tools.get(name) : method !== undefined ? route.mcp!.methods.get(method) : undefined) ?? route
    trace.route = chosen
    const keyed = chosen.config.idempotency !== 'off'
    return { route: chosen, request: withMetaHeaders(request, fields, chosen.fenceArgument), bytes, fields, payload: keyed ? payloadOf(message, method, name) : undefined }
  } catch (err) {
    await auditRejection(ctx, trace, err)
    throw err
  }
}

function invalid(detail: string): FencegateError {
  return new FencegateError('invalid_request', detail)
}

/** The body as one JSON object, from the strict reading's parse; a batch or any other JSON value is refused. */
function oneMessage(fields: BodyFields): Message {
  const root = fields.json
  // No JSON value: an empty body, or a form (the reading refuses a form that is JSON).
  if (root === undefined) throw invalid('an MCP route takes one JSON-RPC message as JSON')
  if (Array.isArray(root)) throw invalid('a JSON-RPC batch is not forwarded: each message is decided by its own rule, so send them one by one')
  if (root === null || typeof root !== 'object') throw invalid('the body is not one JSON-RPC message (a JSON object)')
  return root as Message
}

function toolName(message: Message, fields: BodyFields): string {
  const name = message.params?.name
  if (typeof name !== 'string' || name === '') throw invalid('a tools/call without a string params.name cannot be decided by its tool')
  return fields.at(['params', 'name'])!
}

// The body field each method's `Mcp-Name` mirrors (MCP 2026-07-28, as both SDK lines send it).
const nameSources: Record<string, string> = { 'tools/call': 'name', 'prompts/get': 'name', 'resources/read': 'uri', 'tasks/get': 'taskId', 'tasks/update': 'taskId', 'tasks/cancel': 'taskId' }

/** `Mcp-Method` and `Mcp-Name` must say what the body says: an upstream routing on them must not act on another message than was decided. */
function refuseContradictingHeaders(headers: HeaderView, message: Message, method: string | undefined): void {
  const saidMethod = headers.get('mcp-method')
  if (saidMethod !== null && saidMethod !== method) throw invalid(`Mcp-Method says ${JSON.stringify(saidMethod)} but the body's method is ${JSON.stringify(method ?? null)}`)
  const saidName = headers.get('mcp-name')
  if (saidName === null) return
  const field = method === undefined ? undefined : nameSources[method]
  const value = field === undefined ? undefined : message.params?.[field]
  if (value !== decodeParamValue(saidName)) throw invalid(`Mcp-Name says ${JSON.stringify(saidName)}, which is not the body's params.${field ?? 'name'}`)
}

/** An `Mcp-*` header value: as sent, or `=?base64?…?=` for one that is not plain visible ASCII. */
function decodeParamValue(value: string): string | undefined {
  const m = /^=\?base64\?([A-Za-z0-9+/=]*)\?=$/.exec(value)
  if (!m) return value
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(Uint8Array.from(atob(m[1]!), (c) => c.charCodeAt(0)))
  } catch {
    return undefined
  }
}

/** The request with `_meta`'s fence and key (or a fence argument's) as the headers the steps read; a header saying otherwise is refused. */
function withMetaHeaders(request: Inbound, fields: BodyFields, fenceArgument: string | undefined): Inbound {
  const extra: Record<string, string> = {}
  const fence = bodyFence(request.headers, fields, fenceArgument)
  if (fence !== undefined) extra[fenceHeader] = fence
  const key = fields.at(['params', '_meta', metaKey])
  if (key !== undefined) {
    const read = parseIdempotencyKey(keyHeaderValue(key), `params._meta["${metaKey}"]`)!
    const header = parseIdempotencyKey(request.headers.get(idempotencyHeader))
    if (header !== undefined && header !== read) throw new FencegateError('invalid_idempotency_key', `Idempotency-Key and params._meta["${metaKey}"] name different keys`)
    extra[idempotencyHeader] = keyHeaderValue(read)
  }
  if (Object.keys(extra).length === 0) return request
  const headers = overlay(request.headers, extra)
  return { method: request.method, url: request.url, headers, readBody: (l) => request.readBody(l), passBody: (l) => request.passBody(l), get signal() { return request.signal } }
}

/**
 * The fence the body presents, in `_meta` or in the rule's fence argument, checked against
 * every other place it may be: each fence presented must be the same one (`invalid_fence`), and
 * an `Mcp-Param-Fence` header, which mirrors the argument on 2026-07-28, must say what the body
 * says (`invalid_request`): a mirrored header is never read where the body contradicts it.
 */
function bodyFence(headers: HeaderView, fields: BodyFields, fenceArgument: string | undefined): string | undefined {
  const argument = fenceArgument === undefined ? undefined : fields.at(['params', 'arguments', fenceArgument])
  if (fenceArgument !== undefined) {
    const mirrored = headers.get(mirroredFenceHeader)
    if (mirrored !== null && decodeParamValue(mirrored) !== argument) {
      throw invalid(`${mirroredFenceHeader} says ${JSON.stringify(mirrored)}, which is not the body's params.arguments.${fenceArgument} (${JSON.stringify(argument ?? null)})`)
    }
  }
  const meta = fields.at(['params', '_meta', metaFence])
  // No fence in the body: the header alone is read by the fence step, as on other routes.
  if (meta === undefined && argument === undefined) return undefined
  const presented: [string, string][] = []
  const header = parseFence(headers.get(fenceHeader))
  if (header !== undefined) presented.push(['X-Execution-Fence', header])
  if (meta !== undefined) presented.push([`params._meta["${metaFence}"]`, parseFenceIn(meta, `params._meta["${metaFence}"]`)])
  if (argument !== undefined) presented.push([`params.arguments.${fenceArgument}`, parseFenceIn(argument, `params.arguments.${fenceArgument}`)])
  const [first, ...rest] = presented as [[string, string], ...[string, string][]]
  const other = rest.find(([, f]) => f !== first[1])
  if (other) throw new FencegateError('invalid_fence', `${first[0]} (${first[1]}) and ${other[0]} (${other[1]}) name different fences`)
  return first[1]
}

/** The header the 2.x SDK mirrors an argument declared `"x-mcp-header": "Fence"` in (SEP-2243, 2026-07-28). */
export const mirroredFenceHeader = 'mcp-param-fence'

function parseFenceIn(value: string, where: string): string {
  try {
    return parseFence(value)!
  } catch {
    throw new FencegateError('invalid_fence', `${where} must be exactly one decimal integer between 0 and 9223372036854775807`)
  }
}

function overlay(view: HeaderView, extra: Record<string, string>): HeaderView {
  return {
    get: (name) => extra[name.toLowerCase()] ?? view.get(name),
    forEach(each) {
      view.forEach((value, name) => {
        if (!Object.hasOwn(extra, name.toLowerCase())) each(value, name)
      })
      for (const [name, value] of Object.entries(extra)) each(value, name)
    },
    ...(view.repeated ? { repeated: (name: string) => view.repeated!(name) } : {}),
  }
}

function payloadOf(message: Message, method: string | undefined, name: string | undefined): Uint8Array {
  const { _meta: _ignored, ...params } = message.params ?? {}
  return utf8.encode(`mcp\n${method ?? ''}\n${name ?? ''}\n${JSON.stringify(params)}`)
}

/**
 * A stored answer as a duplicate's: its own JSON-RPC id spliced in (every other byte as stored),
 * and no `Mcp-Session-Id` (the 1.x client adopts any session id it is given).
 *
 * @example return replayForMessage(replay, trace.rpc?.id)
 */
export function replayForMessage(answer: Answer, id: RpcId | undefined): Answer {
  answer.headers.delete('mcp-session-id')
  if (id === undefined || id === null || !(answer.body instanceof Uint8Array)) return answer
  return { ...answer, body: withRpcId(answer.body, answer.headers.get('content-type'), id) }
}
