// What the load generator sends in one case, the same for wrk (as a Lua script) and for
// autocannon: a 32-byte JSON POST whose path names the entity, an X-Execution-Fence, and
// for the idempotent cases an Idempotency-Key, new on every request or drawn from a pool
// of keys completed beforehand; or, for a route that reads its key from the body, the same
// JSON with a new `idempotency_key` field on every request; or, for the MCP cases, a JSON-RPC
// `tools/call` POSTed to `/mcp` as an agent's client sends it on protocol 2026-07-28, with a
// new id per call and the fence and a new key in its `params._meta`.

export const requestBody = '{"amount":1250,"currency":"EUR"}'

export interface Traffic {
  /** The path, with `{id}` where the entity's id goes. */
  path: string
  /** `spread`: an id drawn at random from `ids`; `hot`: always `hot`. */
  entity: 'spread' | 'hot'
  /**
   * `new`: `<keyPrefix><n>`, a new key on every request; `replay`: `<replayPrefix><i>`, i < replayKeys,
   * with id i % ids; `body`: a new `<keyPrefix><n>` in the body's `idempotency_key` (no header);
   * `meta`: an MCP `tools/call` (mcpCall), id n, the fence and a new `<keyPrefix><n>` in `_meta` (no fence header);
   * `meta-rest`: the same call to a REST route, the path naming the entity, the fence in
   * `X-Execution-Fence` and the same key in `Idempotency-Key` as well.
   */
  key: 'none' | 'new' | 'replay' | 'body' | 'meta' | 'meta-rest'
  ids: number
  replayKeys: number
  /** Unique per run, so a new key is never one sent before. */
  keyPrefix: string
  replayPrefix: string
  /** One fence for the whole bench: equal fences are accepted, so none goes stale. */
  fence: string
  /**
   * When set, every request presents a higher fence than the one before: `<raiseBase><n>`, n
   * zero-padded to 6 digits (raiseBase is the run's start in ms, so runs count up too). Each
   * accepted request then raises its entity's fence and writes a fence history row.
   */
  raiseBase?: string
}

/** One request, for autocannon and for the replay pool's preparation. */
export interface Outgoing {
  path: string
  headers: Record<string, string>
  /** The JSON body; `requestBody` when absent. */
  body?: string
}

/** The body of a `key: 'body'` request: `requestBody` with the key as its last field. */
export function bodyWithKey(key: string): string {
  return `${requestBody.slice(0, -1)},"idempotency_key":${JSON.stringify(key)}}`
}

/** The headers every request of the traffic carries; an MCP call's are its protocol's, its fence is in the body. */
export function baseHeaders(t: Pick<Traffic, 'key' | 'fence'>): Record<string, string> {
  // Spelled as the wrk script's per-request headers are (`X-Execution-Fence` when a case raises), so Lua sets one entry, not two.
  if (t.key !== 'meta' && t.key !== 'meta-rest') return { 'Content-Type': 'application/json', 'X-Execution-Fence': t.fence }
  return {
    'content-type': 'application/json', accept: 'application/json, text/event-stream',
    'mcp-protocol-version': '2026-07-28', 'mcp-method': 'tools/call', 'mcp-name': mcpTool,
    ...(t.key === 'meta-rest' ? { 'X-Execution-Fence': t.fence } : {}),
  }
}

/** The tool the MCP cases call (bench/mcp-server.ts); fencegate's rule for it is in bench/systems.ts. */
export const mcpTool = 'capture_payment'

/**
 * The MCP cases' `tools/call`, split where wrk's script and autocannon put the invoice id, the
 * call's number (its JSON-RPC id and its key's suffix), the fence and the key prefix: a new id
 * per call, as every MCP client sends, and 2026-07-28's per-request envelope in `_meta`.
 */
export const mcpCallParts = (fence: string, keyPrefix: string) => [
  '{"jsonrpc":"2.0","id":', /* n */ `,"method":"tools/call","params":{"name":"${mcpTool}","arguments":{"invoice_id":"`, /* id */
  `","amount":1250,"currency":"EUR"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.fencegate/fence":${JSON.stringify(fence)},"io.fencegate/idempotency-key":${JSON.stringify(keyPrefix).slice(0, -1)}`, /* n */
  '"}}}',
] as const

/** One MCP call's body: call n about invoice `id`. */
export function mcpCall(id: string, n: number, fence: string, keyPrefix: string): string {
  const [a, b, c, d] = mcpCallParts(fence, keyPrefix)
  return `${a}${n}${b}${id}${c}${n}${d}`
}

/** The replay pool's key i, with the path it was completed on (so it carries its original payload). */
export function pooled(t: Pick<Traffic, 'path' | 'ids' | 'replayPrefix'>, i: number): Outgoing {
  const [head, tail = ''] = t.path.split('{id}')
  return { path: `${head}${i % t.ids}${tail}`, headers: { 'idempotency-key': `${t.replayPrefix}${i}` } }
}

/** A request generator for autocannon. */
export function requests(t: Traffic): () => Outgoing {
  const [head, tail = ''] = t.path.split('{id}')
  let n = 0
  return () => {
    if (t.key === 'replay') return pooled(t, Math.floor(Math.random() * t.replayKeys))
    const id = t.entity === 'hot' ? 'hot' : String(Math.floor(Math.random() * t.ids))
    if (t.key === 'meta') return { path: t.path, headers: {}, body: mcpCall(id, n++, t.fence, t.keyPrefix) }
    if (t.key === 'meta-rest') return { path: `${head}${id}${tail}`, headers: { 'idempotency-key': `${t.keyPrefix}${n}` }, body: mcpCall(id, n++, t.fence, t.keyPrefix) }
    const headers: Record<string, string> = t.key === 'new' ? { 'idempotency-key': `${t.keyPrefix}${n}` } : {}
    if (t.raiseBase !== undefined) headers['x-execution-fence'] = `${t.raiseBase}${String(n).padStart(6, '0')}`
    const body = t.key === 'body' ? bodyWithKey(`${t.keyPrefix}${n}`) : undefined
    n++
    return { path: `${head}${id}${tail}`, headers, ...(body === undefined ? {} : { body }) }
  }
}

const lua = (s: string) => JSON.stringify(s) // a JSON string of ASCII is a valid Lua string literal

/** The same traffic as a wrk script; `done` prints one line the bench parses. */
export function wrkScript(t: Traffic): string {
  const [head, tail = ''] = t.path.split('{id}')
  const pick = t.key === 'replay'
    ? `local i = math.random(0, ${t.replayKeys - 1})\n  headers["Idempotency-Key"] = ${lua(t.replayPrefix)} .. i\n  local id = i % ${t.ids}`
    : `local id = ${t.entity === 'hot' ? '"hot"' : `math.random(0, ${t.ids - 1})`}` +
      (t.key === 'new' || t.key === 'meta-rest' ? `\n  headers["Idempotency-Key"] = ${lua(t.keyPrefix)} .. n` : '') +
      (t.raiseBase !== undefined ? `\n  headers["X-Execution-Fence"] = ${lua(t.raiseBase)} .. string.format("%06d", n)` : '')
  // A body key: the JSON with its last brace replaced by the key field (bodyWithKey).
  const [ca, cb, cc, cd] = mcpCallParts(t.fence, t.keyPrefix).map(lua)
  const send = t.key === 'body' ? `${lua(requestBody.slice(0, -1) + ',"idempotency_key":"')} .. ${lua(t.keyPrefix)} .. n .. '"}'`
    : t.key === 'meta' || t.key === 'meta-rest' ? `${ca} .. n .. ${cb} .. id .. ${cc} .. n .. ${cd}` : 'body'
  // An MCP call's entity is in its body: its path has no {id}.
  const path = t.key === 'meta' ? lua(t.path) : `${lua(head)} .. id .. ${lua(tail)}`
  const headers = Object.entries(baseHeaders(t)).map(([name, value]) => `[${lua(name)}] = ${lua(value)}`).join(', ')
  return `-- generated by bench/traffic.ts
local n = 0
local body = ${lua(requestBody)}
local headers = { ${headers} }
request = function()
  ${pick}
  local b = ${send}
  n = n + 1
  return wrk.format("POST", ${path}, headers, b)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH_RESULT %d %d %d %d %d %d %d %.0f %.0f %.0f\\n",
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.max))
end
`
}
