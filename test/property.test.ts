/**
 * Property-based tests: thousands of generated requests through the real gateway
 * (loopback HTTP, PGlite store, undici forward, a real recording upstream).
 *
 * Every request the upstream receives is numbered; the upstream answers with
 * `x-upstream-n`, which the gateway passes through, so each response is either
 * a forward (carries `x-upstream-n`), a replay (`idempotent-replayed: true`), a
 * fencegate problem (application/problem+json), or a refusal by Node's HTTP
 * parser (empty 400/431, for malformed requests only). A trigger on fg_fences
 * logs every fence decision with its entity, so "forwarded only with an accepted
 * fence" is checked against what the store actually decided.
 */
import { connect } from 'node:net'
import type { ServerResponse } from 'node:http'
import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it, vi, type MockInstance } from 'vitest'
import { maxFence } from '../src/gateway/fence.js'
import type { Logger, LogFields } from '../src/observe/log.js'
import { problemCatalog } from '../src/http/problems.js'
import { browserGuard } from '../src/http/browser-guard.js'
import { jobsPath } from '../src/leases/api.js'
import { unsafeTarget } from '../src/http/target.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { hmacAuthenticator, jwtAuth, secret, token } from './helpers/tokens.js'
import { startUpstream, type ReceivedRequest, type TestUpstream } from './helpers/upstream.js'

/**
 * BUG (src): an entity containing U+0000 (`/payments/%00/capture`, `?account=%00`,
 * `{"ticket":{"id":"\u0000"}}`) reaches PostgreSQL, which refuses NUL in text, and
 * the client gets 503 store_unavailable with a healthy store. The fuzzers below
 * leave NUL out so they keep testing everything else; the property under
 * "BUG: text that PostgreSQL cannot store" at the end of this file fails until it
 * is fixed. Set this to true once it is, to let the fuzzers generate NUL too.
 */
const NUL_IN_ENTITIES_FIXED = true

/**
 * Runs are bounded by count; the time limit only matters when a failure shrinks
 * slowly on a loaded machine: fast-check then still reports the counterexample and
 * its seed before vitest's timeout (below) would hide them.
 */
const bounded = (numRuns: number) => ({ numRuns, interruptAfterTimeLimit: 100_000 })
const slow = 120_000

const maxBody = 4096
const hostHeader = 'gateway.test'

// ---------------------------------------------------------------------------
// A raw HTTP/1.1 client: fetch and node:http refuse or normalise what we want to send.
// ---------------------------------------------------------------------------

interface RawRequest {
  method: string
  target: string
  host: string
  /** Header lines as sent (latin1); duplicates are separate lines. */
  headers: [string, string][]
  body: Uint8Array
  chunked: boolean
  /** Valid HTTP/1.1 that Node's parser accepts: it must get a fencegate answer. */
  wellFormed: boolean
  /** The tenant the gateway must attribute this request to, if it may forward it at all. */
  tenant: string | undefined
  /** Scopes of the presented token (B only). */
  scopes: string[]
  /** Gateway G: the code its browser guard must refuse this with, or null when it passes (undefined elsewhere). */
  guardRefuses?: string | null
  /** A plausible request: the refusal it must get (expectedRefusal), or null for none of the modelled ones. */
  expected?: string | null
  /** A request with two readings (issue 27), for the generator's coverage. */
  reading?: Reading
  /** It carries X-HTTP-Method-Override and X-Original-URL, which must not reach the upstream. */
  rewrite?: boolean
}

interface RawResponse {
  status: number
  headers: Map<string, string[]>
  body: Buffer
  complete: boolean
}

function header(res: RawResponse, name: string): string | undefined {
  return res.headers.get(name)?.join(', ')
}

function encodeChunked(body: Uint8Array): Buffer {
  const parts: Buffer[] = []
  const cut = [0, Math.floor(body.byteLength / 3), Math.floor((2 * body.byteLength) / 3), body.byteLength]
  for (let i = 0; i < 3; i++) {
    const piece = body.subarray(cut[i], cut[i + 1])
    if (piece.byteLength > 0) parts.push(Buffer.from(`${piece.byteLength.toString(16)}\r\n`, 'latin1'), Buffer.from(piece), Buffer.from('\r\n'))
  }
  parts.push(Buffer.from('0\r\n\r\n'))
  return Buffer.concat(parts)
}

function decodeChunked(data: Buffer): Buffer | undefined {
  const parts: Buffer[] = []
  let at = 0
  for (;;) {
    const eol = data.indexOf('\r\n', at)
    if (eol < 0) return undefined
    const size = parseInt(data.subarray(at, eol).toString('latin1').split(';')[0]!, 16)
    if (Number.isNaN(size)) return undefined
    if (size === 0) return Buffer.concat(parts)
    if (data.length < eol + 2 + size) return undefined
    parts.push(data.subarray(eol + 2, eol + 2 + size))
    at = eol + 2 + size + 2
  }
}

function parseResponse(data: Buffer, head: boolean): RawResponse | undefined {
  const end = data.indexOf('\r\n\r\n')
  if (end < 0) return undefined
  const [statusLine, ...lines] = data.subarray(0, end).toString('latin1').split('\r\n')
  const status = Number(statusLine!.split(' ')[1])
  const headers = new Map<string, string[]>()
  for (const line of lines) {
    const i = line.indexOf(':')
    const name = line.slice(0, i).trim().toLowerCase()
    headers.set(name, [...(headers.get(name) ?? []), line.slice(i + 1).trim()])
  }
  const rest = data.subarray(end + 4)
  if (head || status === 204 || status === 304) return { status, headers, body: Buffer.alloc(0), complete: true }
  if ((headers.get('transfer-encoding')?.[0] ?? '').toLowerCase() === 'chunked') {
    const body = decodeChunked(rest)
    return { status, headers, body: body ?? rest, complete: body !== undefined }
  }
  const length = headers.get('content-length')?.[0]
  if (length !== undefined) return { status, headers, body: rest.subarray(0, Number(length)), complete: rest.length >= Number(length) }
  return { status, headers, body: rest, complete: true }
}

/** Sends one request on its own connection (`connection: close`) and reads the answer until the server closes. */
function rawSend(port: number, r: RawRequest): Promise<RawResponse | undefined> {
  const lines = [`${r.method} ${r.target} HTTP/1.1`, `host: ${r.host}`]
  if (!r.headers.some(([n]) => n.toLowerCase() === 'connection')) lines.push('connection: close')
  for (const [name, value] of r.headers) lines.push(`${name}: ${value}`)
  lines.push(r.chunked ? 'transfer-encoding: chunked' : `content-length: ${r.body.byteLength}`)
  const head = Buffer.from(`${lines.join('\r\n')}\r\n\r\n`, 'latin1')
  const bytes = Buffer.concat([head, r.chunked ? encodeChunked(r.body) : Buffer.from(r.body)])
  return new Promise((resolve) => {
    const chunks: Buffer[] = []
    // write, not end: Node's server aborts a request whose client half-closes before the answer.
    const socket = connect(port, '127.0.0.1', () => socket.write(bytes))
    socket.on('data', (c: Buffer) => chunks.push(c))
    // A reset after the answer arrived is fine; without an answer the result is undefined.
    socket.on('error', () => {})
    socket.on('close', () => resolve(parseResponse(Buffer.concat(chunks), r.method === 'HEAD')))
  })
}

// ---------------------------------------------------------------------------
// The world: one store, one upstream, gateway A (no auth), gateway B (JWT), and gateway G
// (A's routes without auth behind the browser guard, as `fencegate serve` runs them).
// ---------------------------------------------------------------------------

let t: TestDb
let upstream: TestUpstream
let gwA: TestGateway
let gwB: TestGateway
/** Gateway A's routes without auth behind the browser guard, as `fencegate serve` builds it (issue 27). */
let gwG: TestGateway
let portA: number
let portB: number
let portG: number
/** Status the upstream answered for each upstream request number (1-based). */
const upstreamStatus: number[] = [0]
const logged: { level: string; event: string; fields: LogFields | undefined }[] = []
const log: Logger = {
  debug() {},
  info() {},
  warn: (event, fields) => void logged.push({ level: 'warn', event, fields }),
  error: (event, fields) => void logged.push({ level: 'error', event, fields }),
}
let consoleError: MockInstance<typeof console.error>
let run = 0
let unique = 0

const upstreamStatuses = new Set([200, 201, 204, 400, 404, 409, 422, 429])

function upstreamHandler(req: ReceivedRequest, res: ServerResponse): void {
  // received[] was pushed synchronously just before this call, so its length numbers the request.
  const n = upstream.received.length
  const wanted = Number(req.headers['x-upstream-status'])
  const status = upstreamStatuses.has(wanted) ? wanted : 200
  upstreamStatus[n] = status
  const headers: Record<string, string> = { 'content-type': 'application/json', 'x-upstream-n': String(n) }
  // An upstream claiming a replay must not be believed: the gateway strips this.
  if (req.headers['x-upstream-replayed'] !== undefined) headers['idempotent-replayed'] = 'true'
  res.writeHead(status, headers)
  res.end(JSON.stringify({ n, method: req.method, path: req.path, fence: req.headers['x-execution-fence'] ?? null }))
}

interface Shape {
  name: string
  method: string
  pattern: RegExp
  fence: 'required' | 'optional' | 'off'
  scopes: string[]
  /** The entity the gateway must have fenced, computed from what the upstream received (and, for a header, what was sent). */
  entity?: (m: RegExpExecArray, rec: ReceivedRequest, query: URLSearchParams, sent: RawRequest) => string | undefined
  /** Headers the route reads that must arrive once (entity, claimed tenant, a read body's Content-Type): sent twice, never forwarded. */
  once?: string[]
  /** What the route's config reads, for predicting its refusals (expectedRefusal): its entity template's source, */
  reads?: Source
  /** its idempotency (off when absent), */
  idempotency?: 'required' | 'optional'
  /** its key's source when not the Idempotency-Key header, */
  key?: Source
  /** and its claimed_tenant. */
  claim?: ['header', string] | ['body', ...string[]]
}
/** A template's source as the route's config names it: `['query', 'account']` is `{query.account}`. */
type Source = ['params'] | ['query', string] | ['header', string] | ['body', ...string[]]

/**
 * A header's value as the gateway reads it: each line's value without its leading and trailing
 * spaces and tabs (HTTP's OWS), repeated lines joined with ", " as Web Headers joins them.
 * Not what the upstream sees: two empty lines are ", " here and arrive as ",", trimmed again.
 */
function sentHeader(sent: RawRequest, name: string): string | undefined {
  const values = sent.headers.filter(([n]) => n.toLowerCase() === name).map(([, v]) => v.replace(/^[ \t]+|[ \t]+$/g, ''))
  return values.length === 0 ? undefined : values.join(', ')
}

const param = (m: RegExpExecArray) => decodeURIComponent(m[1]!)
function jsonOf(body: Buffer): unknown {
  try {
    return JSON.parse(new TextDecoder('utf-8', { fatal: true }).decode(body))
  } catch {
    return undefined
  }
}
/**
 * Whether a JSON text names a key twice in one object, keys compared as parsed (`"\u0074"` is `"t"`);
 * false when it is not JSON. Written apart from src/http/json-keys.ts, which it checks.
 */
function namesAKeyTwice(bytes: Uint8Array): boolean {
  let text: string
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes)
    JSON.parse(text)
  } catch {
    return false
  }
  let i = 0
  const space = () => {
    while (' \t\r\n'.includes(text[i] ?? 'x')) i++
  }
  const string = () => {
    const start = i++
    while (text[i] !== '"') i += text[i] === '\\' ? 2 : 1
    return JSON.parse(text.slice(start, ++i)) as string
  }
  // Parses one value from i (the text is JSON); true as soon as an object names a key twice.
  const twice = (): boolean => {
    space()
    const open = text[i]
    if (open === '"') {
      string()
      return false
    }
    if (open !== '{' && open !== '[') {
      while (i < text.length && !' \t\r\n,]}'.includes(text[i]!)) i++
      return false
    }
    i++
    space()
    if (text[i] === (open === '{' ? '}' : ']')) {
      i++
      return false
    }
    const keys = new Set<string>()
    for (;;) {
      if (open === '{') {
        space()
        const key = string()
        if (keys.has(key)) return true
        keys.add(key)
        space()
        i++ // the colon
      }
      if (twice()) return true
      space()
      if (text[i++] !== ',') return false
    }
  }
  return twice()
}
function bodyPath(body: Buffer, path: string[]): unknown {
  let node = jsonOf(body)
  for (const key of path) {
    if (node === null || typeof node !== 'object' || !Object.hasOwn(node, key)) return undefined
    node = (node as Record<string, unknown>)[key]
  }
  return node
}

/** The gateways: A without auth, B with JWT, G as A behind the browser guard. */
type Gw = 'a' | 'b' | 'g'
/** The generators and routes a gateway's traffic is drawn from: G's are A's. */
const like = (gw: Gw): 'a' | 'b' => (gw === 'b' ? 'b' : 'a')

// Route shapes per gateway, keyed by the upstream base path each gateway's routes use.
const shapes: Record<'/a' | '/b' | '/g', Shape[]> = {
  '/a': [
    { name: 'capture', method: 'POST', pattern: /^\/payments\/([^/]+)\/capture$/, fence: 'required', scopes: [], reads: ['params'], entity: (m) => `invoice:${param(m)}` },
    // Fenced, `?account=1&account=2` has two readings (issue 27): one forwarded fails here rather than being read first-wins.
    { name: 'acct', method: 'PUT', pattern: /^\/accounts\/([^/]+)$/, fence: 'optional', scopes: [], reads: ['query', 'account'], entity: (_m, _r, q) => (q.getAll('account').length === 1 ? `acct:${q.get('account')}` : `acct: ${q.getAll('account').length} readings`) },
    // X-Account may be named in Connection: then the gateway fences on it but drops it before the upstream.
    { name: 'hdr', method: 'PATCH', pattern: /^\/h$/, fence: 'required', scopes: [], once: ['x-account'], reads: ['header', 'x-account'], entity: (_m, r, _q, sent) => (r.headers['x-account'] === undefined ? undefined : `hdr:${sentHeader(sent, 'x-account')}`) },
    // A body naming a key twice has two readings (issue 27): one forwarded fails here rather than being read last-wins.
    { name: 'ticket', method: 'POST', pattern: /^\/tickets$/, fence: 'required', scopes: [], once: ['content-type'], reads: ['body', 'ticket', 'id'], entity: (_m, r) => (namesAKeyTwice(r.body) ? 'ticket: two readings' : `ticket:${String(bodyPath(r.body, ['ticket', 'id']))}`) },
    { name: 'order', method: 'POST', pattern: /^\/orders\/([^/]+)$/, fence: 'optional', scopes: [], reads: ['params'], idempotency: 'required', entity: (m) => `order:${param(m)}` },
    { name: 'open', method: 'DELETE', pattern: /^\/open\/([^/]+)$/, fence: 'off', scopes: [] },
    { name: 'read', method: 'GET', pattern: /^\/open\/([^/]+)$/, fence: 'off', scopes: [], idempotency: 'optional' },
    // Its key is read from the query: `?op=a&op=b` names two operations (issue 27).
    { name: 'keyed', method: 'PUT', pattern: /^\/keyed\/([^/]+)$/, fence: 'off', scopes: [], idempotency: 'optional', key: ['query', 'op'] },
  ],
  '/b': [
    { name: 'capture', method: 'POST', pattern: /^\/payments\/([^/]+)\/capture$/, fence: 'required', scopes: ['payments:write'], once: ['x-tenant'], reads: ['params'], claim: ['header', 'x-tenant'], entity: (m) => `invoice:${param(m)}` },
    { name: 'order', method: 'POST', pattern: /^\/orders\/([^/]+)$/, fence: 'optional', scopes: [], once: ['content-type'], reads: ['params'], idempotency: 'required', claim: ['body', 'tenant'], entity: (m) => `order:${param(m)}` },
    { name: 'plain', method: 'PUT', pattern: /^\/plain\/([^/]+)$/, fence: 'required', scopes: [], reads: ['params'], entity: (m) => `plain:${param(m)}` },
  ],
  '/g': [],
}
shapes['/g'] = shapes['/a']

function routesA(u: string) {
  return [
    route(u),
    route(u, { name: 'acct', method: 'PUT', path: '/accounts/:id', fence: 'optional', entity: 'acct:{query.account}' }),
    route(u, { name: 'hdr', method: 'PATCH', path: '/h', entity: 'hdr:{header.X-Account}' }),
    route(u, { name: 'ticket', path: '/tickets', entity: 'ticket:{body.ticket.id}' }),
    route(u, { name: 'order', path: '/orders/:order_id', fence: 'optional', entity: 'order:{params.order_id}', idempotency: 'required' }),
    route(u, { name: 'open', method: 'DELETE', path: '/open/:x', fence: 'off', entity: undefined }),
    route(u, { name: 'read', method: 'GET', path: '/open/:x', fence: 'off', entity: undefined, idempotency: 'optional' }),
    route(u, { name: 'keyed', method: 'PUT', path: '/keyed/:x', fence: 'off', entity: undefined, idempotency: 'optional', idempotency_key: 'op:{query.op}' }),
  ]
}

function routesB(u: string) {
  return [
    route(u, { scopes: ['payments:write'], claimed_tenant: 'header.X-Tenant' }),
    route(u, { name: 'order', path: '/orders/:order_id', fence: 'optional', entity: 'order:{params.order_id}', idempotency: 'required', claimed_tenant: 'body.tenant' }),
    route(u, { name: 'plain', method: 'PUT', path: '/plain/:id', entity: 'plain:{params.id}' }),
  ]
}

// Tokens for gateway B: a label, its Authorization value, and whom it authenticates.
interface TokenChoice { label: string; value: string; tenant: string | undefined; scopes: string[] }
let tokenChoices: TokenChoice[] = []
const acmeW = () => tokenChoices.find((c) => c.label === 'acme-w')!
const globexW = () => tokenChoices.find((c) => c.label === 'globex-w')!

/** Changes one full base64url character in the middle of the signature (the last one may be padding bits only). */
function tamper(jwt: string): string {
  const at = jwt.length - 10
  return jwt.slice(0, at) + (jwt[at] === 'A' ? 'B' : 'A') + jwt.slice(at + 1)
}

async function makeTokens(): Promise<TokenChoice[]> {
  const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64url')
  const now = Math.floor(Date.now() / 1000)
  const valid = [
    { label: 'acme-w', jwt: await token({ scope: 'payments:write' }), tenant: 'acme', scopes: ['payments:write'] },
    { label: 'acme', jwt: await token(), tenant: 'acme', scopes: [] },
    { label: 'globex-w', jwt: await token({ tenant_id: 'globex', sub: 'w2', scope: 'other payments:write' }), tenant: 'globex', scopes: ['other', 'payments:write'] },
    { label: 'unicode-tenant', jwt: await token({ tenant_id: 'tënant-ü', scope: 'payments:write' }), tenant: 'tënant-ü', scopes: ['payments:write'] },
  ]
  const invalid = [
    { label: 'expired', jwt: await token({}, { exp: now - 3600 }) },
    { label: 'wrong-key', jwt: await token({}, { key: new TextEncoder().encode(`${secret}-other`) }) },
    { label: 'wrong-aud', jwt: await token({}, { aud: 'someone-else' }) },
    { label: 'wrong-iss', jwt: await token({}, { iss: 'https://evil.test' }) },
    { label: 'no-tenant', jwt: await token({ tenant_id: undefined }) },
    { label: 'empty-tenant', jwt: await token({ tenant_id: '' }) },
    { label: 'number-tenant', jwt: await token({ tenant_id: 42 }) },
    { label: 'long-tenant', jwt: await token({ tenant_id: 't'.repeat(129) }) },
    { label: 'alg-none', jwt: `${b64({ alg: 'none', typ: 'JWT' })}.${b64({ tenant_id: 'acme', iss: jwtAuth.issuer, aud: jwtAuth.audience, exp: now + 300 })}.` },
  ]
  return [
    ...valid.flatMap((v) => [
      { label: v.label, value: `Bearer ${v.jwt}`, tenant: v.tenant, scopes: v.scopes },
      { label: `${v.label}/lower`, value: `bearer ${v.jwt}`, tenant: v.tenant, scopes: v.scopes },
      { label: `${v.label}/spaces`, value: `Bearer   ${v.jwt}`, tenant: v.tenant, scopes: v.scopes },
      { label: `${v.label}/bare`, value: v.jwt, tenant: undefined, scopes: [] },
      { label: `${v.label}/basic`, value: `Basic ${v.jwt}`, tenant: undefined, scopes: [] },
      { label: `${v.label}/tampered`, value: `Bearer ${tamper(v.jwt)}`, tenant: undefined, scopes: [] },
      { label: `${v.label}/two-parts`, value: `Bearer ${v.jwt.split('.').slice(0, 2).join('.')}`, tenant: undefined, scopes: [] },
    ]),
    ...invalid.map((v) => ({ label: v.label, value: `Bearer ${v.jwt}`, tenant: undefined, scopes: [] })),
    { label: 'empty', value: '', tenant: undefined, scopes: [] },
    { label: 'bearer-only', value: 'Bearer', tenant: undefined, scopes: [] },
    { label: 'bearer-junk', value: 'Bearer a.b.c', tenant: undefined, scopes: [] },
    { label: 'huge', value: `Bearer ${'a'.repeat(5000)}.${'b'.repeat(3000)}.c`, tenant: undefined, scopes: [] },
  ]
}

beforeAll(async () => {
  t = await backends()[0]!.open()
  // Every change to fg_fences, in the order the row lock serialised them, with its entity.
  await t.db.exec(`
    CREATE TABLE prop_fence_log (seq bigint GENERATED ALWAYS AS IDENTITY, tenant text, entity text, old_fence bigint, new_fence bigint, request_id text);
    CREATE FUNCTION prop_log_fence() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO prop_fence_log (tenant, entity, old_fence, new_fence, request_id)
      VALUES (NEW.tenant, NEW.entity, CASE WHEN TG_OP = 'UPDATE' THEN OLD.highest_fence END, NEW.highest_fence, NEW.request_id);
      RETURN NEW;
    END $$;
    CREATE TRIGGER prop_log_fence AFTER INSERT OR UPDATE ON fg_fences FOR EACH ROW EXECUTE FUNCTION prop_log_fence();`)
  upstream = await startUpstream(upstreamHandler)
  const server = { max_request_body: maxBody }
  gwA = await startTestGateway({ config: testConfig(routesA(`${upstream.url}/a`), { server }), store: t.store, log })
  gwB = await startTestGateway({ config: testConfig(routesB(`${upstream.url}/b`), { server, auth: jwtAuth }), store: t.store, log, authenticate: await hmacAuthenticator() })
  // As src/runtime/node/gateway.ts guards a data plane without auth; the raw client's Host is a named host.
  const guarded = testConfig(routesA(`${upstream.url}/g`), { server: { ...server, allowed_hosts: [hostHeader] } })
  gwG = await startTestGateway({ config: guarded, store: t.store, log, browserGuard: browserGuard(guarded.server.host, guarded.server.allowed_hosts) })
  portA = Number(new URL(gwA.url).port)
  portB = Number(new URL(gwB.url).port)
  portG = Number(new URL(gwG.url).port)
  tokenChoices = await makeTokens()
  consoleError = vi.spyOn(console, 'error')
})

afterAll(async () => {
  consoleError?.mockRestore()
  await gwA?.close()
  await gwB?.close()
  await gwG?.close()
  await upstream?.close()
  await t?.close()
})

interface LogRow { seq: string; tenant: string; entity: string; old_fence: string | null; new_fence: string; request_id: string }

async function logSeq(): Promise<string> {
  const [row] = await t.db.sql<{ seq: string }>`SELECT coalesce(max(seq), 0)::text AS seq FROM prop_fence_log`
  return row!.seq
}
async function logSince(seq: string): Promise<LogRow[]> {
  return t.db.sql<LogRow>`
    SELECT seq::text, tenant, entity, old_fence::text, new_fence::text, request_id
    FROM prop_fence_log AS l WHERE l.seq > ${seq}::bigint ORDER BY l.seq`
}
/** A request id first appears in the log in the row that accepted it; later rows with it are rejections of others. */
function acceptances(rows: LogRow[]): Map<string, LogRow> {
  const first = new Map<string, LogRow>()
  for (const r of rows) if (!first.has(r.request_id)) first.set(r.request_id, r)
  return first
}
/**
 * A fence equal to the entity's highest on the statement's snapshot is accepted by that
 * read and writes nothing (src/store/commands.ts): it is then a fence the log shows the
 * entity was raised to by an earlier change.
 */
async function raisedTo(tenant: string, entity: string | undefined, fence: string): Promise<boolean> {
  const rows = await t.db.sql<{ n: number }>`
    SELECT count(*)::int AS n FROM prop_fence_log
    WHERE tenant = ${tenant} AND (${entity ?? null}::text IS NULL OR entity = ${entity ?? null}) AND new_fence = ${fence}::bigint`
  return rows[0]!.n > 0
}

/** Lone surrogates reach PostgreSQL as U+FFFD (see the report on entity collisions). */
const wellFormed = (s: string) => s.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\ufffd')
const isFence = (v: string) => /^[0-9]{1,19}$/.test(v) && BigInt(v) <= maxFence

// ---------------------------------------------------------------------------
// Generators
// ---------------------------------------------------------------------------

/** A value of `arb` `weight` times in 20, else null. */
const rarely = <T>(arb: fc.Arbitrary<T>, weight: number) => fc.oneof({ weight: 20 - weight, arbitrary: fc.constant(null) }, { weight, arbitrary: arb })
const noNul = (s: string) => NUL_IN_ENTITIES_FIXED || (!s.includes('\0') && !/%00|\\u0000/i.test(s))
const chars = (s: string) => [...s]
const alnum = chars('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789')
// RFC 3986 pchar, plus the characters Node's parser also accepts raw in a target.
const pchar = fc.constantFrom(...alnum, ...chars("-._~!$&'()*+,;=:@{}\"|^`<>"))
const tokenChar = fc.constantFrom(...alnum, ...chars("!#$%&'*+-.^_`|~"))
/** What node:http lets a client send in a header value: HTAB, SP to ~, and obs-text. */
const headerChar = fc.oneof(
  { weight: 8, arbitrary: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)) },
  { weight: 1, arbitrary: fc.constant('\t') },
  { weight: 1, arbitrary: fc.integer({ min: 0x80, max: 0xff }).map((c) => String.fromCharCode(c)) },
)
const headerValue = (maxLength = 40) => fc.string({ unit: headerChar, maxLength })
const utf8AsLatin1 = (s: string) => Buffer.from(s, 'utf8').toString('latin1')
const latin1 = (s: string) => /^[\x00-\xff]*$/.test(s)

const segment = fc.oneof(
  { weight: 6, arbitrary: fc.nat(40).map(String) },
  { weight: 3, arbitrary: fc.string({ unit: pchar, minLength: 1, maxLength: 12 }) },
  { weight: 2, arbitrary: fc.string({ unit: 'grapheme', minLength: 1, maxLength: 6 }).filter(noNul).map(encodeURIComponent) },
  { weight: 2, arbitrary: fc.constantFrom('payments', 'capture', 'accounts', 'h', 'tickets', 'orders', 'open', 'plain', '_fencegate', 'health', 'audit', 'admin') },
  { weight: 2, arbitrary: fc.constantFrom('.', '..', '%2e', '%2E', '%2e%2E', '.%2e', '%2e.', '...', '.x', 'x.', '%252e%252e') },
  { weight: 2, arbitrary: fc.constantFrom('%2f', '%2F', 'a%2fb', '%5c', '%5C..', '%252f', 'a%2F..%2Fb') },
  // Path parameters as Tomcat and Spring read them (issue 27): refused by the raw-target guard.
  { weight: 1, arbitrary: fc.constantFrom('a;b', ';jsessionid=x', '1;x=..', '%3B', '%3b', 'a%3Bb', '%253B') },
  { weight: 2, arbitrary: fc.constantFrom('%', '%z', '%zz', '%e9', '%ED%A0%80', '%C0%AF', '%FF', '%F0%9F%98%80', '%20', '%C3%A9', '%25', '%3F', '%23', 'a%', '%E2%82') },
  { weight: 1, arbitrary: fc.integer({ min: 200, max: 3000 }).map((n) => 'x'.repeat(n)) },
  { weight: 1, arbitrary: fc.constant('') },
  { weight: NUL_IN_ENTITIES_FIXED ? 1 : 0, arbitrary: fc.constantFrom('%00', 'a%00b') },
)

const queryPart = fc.oneof(
  { weight: 3, arbitrary: fc.string({ unit: pchar, maxLength: 8 }) },
  { weight: 2, arbitrary: fc.string({ unit: 'grapheme', maxLength: 6 }).filter(noNul).map(encodeURIComponent) },
  { weight: 1, arbitrary: fc.constantFrom('%', '%zz', '%FF', '%FE', '%ED%A0%80', '+', '%2B', '%26', '/', '?', '%3D', '') },
  { weight: NUL_IN_ENTITIES_FIXED ? 1 : 0, arbitrary: fc.constant('%00') },
)
const query = fc.oneof(
  { weight: 3, arbitrary: fc.constant('') },
  { weight: 4, arbitrary: fc.array(fc.tuple(fc.oneof(fc.constantFrom('account', 'a', 'x', 'tenant', 'op'), queryPart), fc.option(queryPart)), { minLength: 0, maxLength: 4 })
    .map((pairs) => `?${pairs.map(([k, v]) => (v === null ? k : `${k}=${v}`)).join('&')}`) },
)

interface TargetShape { method: string; path: (s: string) => string }
const targetShapes: Record<Gw, TargetShape[]> = {
  a: [
    { method: 'POST', path: (s) => `/payments/${s}/capture` },
    { method: 'PUT', path: (s) => `/accounts/${s}` },
    { method: 'PATCH', path: () => '/h' },
    { method: 'POST', path: () => '/tickets' },
    { method: 'POST', path: (s) => `/orders/${s}` },
    { method: 'DELETE', path: (s) => `/open/${s}` },
    { method: 'GET', path: (s) => `/open/${s}` },
    { method: 'PUT', path: (s) => `/keyed/${s}` },
  ],
  b: [
    { method: 'POST', path: (s) => `/payments/${s}/capture` },
    { method: 'POST', path: (s) => `/orders/${s}` },
    { method: 'PUT', path: (s) => `/plain/${s}` },
  ],
  // The job API's paths, where the guard also wants JSON bodies (G serves no job API: a body it lets through is no_route).
  g: [],
}
targetShapes.g = [...targetShapes.a, { method: 'POST', path: () => jobsPath }, { method: 'POST', path: (s) => `${jobsPath}/${s}/cancel` }]
const methods = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS', 'TRACE', 'PURGE', 'PROPFIND', 'MKCOL', 'COPY', 'SEARCH', 'REPORT']

/** Method and target: well-formed (Node's parser accepts them) or not. */
const methodAndTarget = (gw: Gw) => fc.oneof(
  { weight: 25, arbitrary: fc.record({
    shape: fc.constantFrom(...targetShapes[gw]),
    seg: segment,
    mutation: fc.oneof(
      { weight: 8, arbitrary: fc.constant('none') },
      fc.constantFrom('trailing-slash', 'double-slash', 'free', 'dot-prefix', 'absolute-form', 'fragment'),
    ),
    free: fc.array(segment, { minLength: 0, maxLength: 5 }),
    otherMethod: rarely(fc.constantFrom(...methods), 3),
    q: query,
  }).map(({ shape, seg, mutation, free, otherMethod, q }) => {
    let path = shape.path(seg)
    if (mutation === 'trailing-slash') path += '/'
    else if (mutation === 'double-slash') path = `/${path}`
    else if (mutation === 'free') path = `/${free.join('/')}`
    else if (mutation === 'dot-prefix') path = `/x/..${path}`
    else if (mutation === 'absolute-form') path = `http://evil.example${path}`
    else if (mutation === 'fragment') path += '#/../admin'
    return { method: otherMethod ?? shape.method, target: path + q, wellFormed: true }
  }) },
  { weight: 1, arbitrary: fc.oneof(
    fc.constantFrom('post', 'FOO', 'GET2', 'P0ST').map((method) => ({ method, target: '/payments/1/capture', wellFormed: false })),
    fc.constantFrom('/payments/a\\b/capture', '/payments\\..\\admin', '*', 'payments/1/capture', '/payments/1/capture\\', '/open/\\x')
      .map((target) => ({ method: 'POST', target, wellFormed: false })),
    fc.string({ unit: 'grapheme', minLength: 1, maxLength: 5 }).filter((s) => !/[\s\0]/.test(s) && noNul(s))
      .map((s) => ({ method: 'POST', target: `/payments/${utf8AsLatin1(s)}/capture`, wellFormed: false })),
  ) },
)

const fenceValue = fc.oneof(
  { weight: 8, arbitrary: fc.nat(30).map(String) },
  { weight: 2, arbitrary: fc.bigInt({ min: 0n, max: maxFence }).map(String) },
  { weight: 3, arbitrary: fc.constantFrom(
    '9223372036854775807', '9223372036854775808', '18446744073709551616', '99999999999999999999', '0000000000000000007',
    '00000000000000000007', '-1', '-0', '+5', '1.5', '1.0', '1e3', '0x10', '0b1', '0o7', '1_000', ' 5 ', '5 6', '\t7', '',
    ' ', 'NaN', 'Infinity', '1,2', '1, 2', '\xb9', '\xbd', 'null', '[1]', '"1"',
  ) },
  { weight: 1, arbitrary: fc.constantFrom('١', '１', '٣').map(utf8AsLatin1) },
  { weight: 2, arbitrary: headerValue(25) },
)

const keyValue = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom('k1', 'k2', '"k1"', '"k2"', 'k\\1', '"k\\\\1"') },
  { weight: 2, arbitrary: fc.string({ unit: fc.integer({ min: 0x21, max: 0x7e }).map((c) => String.fromCharCode(c)), minLength: 1, maxLength: 30 }) },
  { weight: 2, arbitrary: fc.array(fc.oneof(fc.integer({ min: 0x20, max: 0x7e }).filter((c) => c !== 0x22 && c !== 0x5c).map((c) => String.fromCharCode(c)), fc.constantFrom('\\"', '\\\\')), { maxLength: 20 })
    .map((parts) => `"${parts.join('')}"`) },
  { weight: 2, arbitrary: fc.constantFrom(
    '', '""', '"a", "b"', 'a, b', 'a,b', 'a b', '"unterminated', 'trailing"', '"\\x"', '"a"b', '"\\"', 'k'.repeat(255), 'k'.repeat(256),
    `"${'k'.repeat(255)}"`, `"${'k'.repeat(256)}"`, `"${'\\"'.repeat(128)}"`, 'a\tb', '\xe9', '"\xe9"', '";"', ':a:', '?1', '*',
  ) },
  { weight: 1, arbitrary: headerValue(30) },
)

const requestIdValue = fc.oneof(
  { weight: 3, arbitrary: fc.constant({ kind: 'valid' as const, value: '' }) },
  { weight: 2, arbitrary: fc.stringMatching(/^[A-Za-z0-9._:-]{1,40}$/).map((value) => ({ kind: 'valid' as const, value })) },
  { weight: 2, arbitrary: fc.constant({ kind: 'none' as const, value: '' }) },
  { weight: 2, arbitrary: headerValue(40).filter((v) => !/^[A-Za-z0-9._:-]{1,128}$/.test(v.replace(/^[ \t]+|[ \t]+$/g, '')))
    .map((value) => ({ kind: 'invalid' as const, value })) },
  { weight: 1, arbitrary: fc.constant({ kind: 'invalid' as const, value: 'r'.repeat(129) }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'dup' as const, value: '' }) },
)

const jsonId = fc.oneof(
  fc.string({ maxLength: 8 }).filter(noNul),
  fc.string({ unit: 'binary', maxLength: 4 }).filter(noNul),
  fc.integer({ min: -5, max: 40 }),
  fc.double({ noNaN: true }),
  fc.constantFrom(9007199254740991, 9007199254740993, -0, 1e21, null, true, [], {}, ''),
)
const body = (gw: Gw) => fc.oneof(
  { weight: 3, arbitrary: fc.constant('') },
  { weight: 3, arbitrary: fc.record({ ticket: fc.option(fc.record({ id: jsonId }, { requiredKeys: [] })), tenant: gw === 'b' ? fc.constantFrom('acme', 'globex', 'tënant-ü', 5, null, { x: 1 }) : fc.constant(undefined) }, { requiredKeys: [] })
    .map((v) => JSON.stringify(v)) },
  { weight: 1, arbitrary: fc.constantFrom('{"ticket":{"id":9007199254740993}}', '{"ticket":{"id":12345678901234567890}}', '{"ticket":{"id":1.0}}', '{"ticket":{"id":"a"},"ticket":{"id":"b"}}', '{"__proto__":{"id":"p"},"ticket":{"__proto__":{"id":1}}}', '{"ticket":{"id":"\\ud800"}}', '{"ticket":{"id":"\\udfff"}}', '{"tenant":"acme"', '[]', 'null', '"x"') },
  { weight: 2, arbitrary: fc.json({ maxDepth: 3 }).filter(noNul) },
  { weight: 2, arbitrary: fc.string({ unit: 'grapheme', maxLength: 200 }) },
  { weight: 2, arbitrary: fc.uint8Array({ maxLength: 600 }) },
  { weight: 1, arbitrary: fc.integer({ min: maxBody - 8, max: maxBody + 2000 }).map((n) => new Uint8Array(n).fill(0x61)) },
).map((b) => (typeof b === 'string' ? new TextEncoder().encode(b) : b))

/**
 * Headers with which a framework runs another method or path than the one the gateway routed
 * (issue 27): dropped on the way upstream. This list is the test's own, so a name dropped from
 * src's list fails here.
 */
const rewritingHeaders = ['x-http-method-override', 'x-http-method', 'x-method-override', 'x-original-url', 'x-rewrite-url']
const extraHeaderName = fc.oneof(
  fc.constantFrom('x-account', 'x-account', 'x-tenant', 'content-type', 'accept', 'x-upstream-status', 'x-upstream-replayed', 'cookie',
    'idempotent-replayed', 'keep-alive', 'te', 'proxy-authorization', 'x-forwarded-for', 'x-forwarded-host', 'via', 'forwarded', 'accept-encoding',
    // Another method or path for the upstream's framework (issue 27): never forwarded.
    ...rewritingHeaders),
  fc.string({ unit: tokenChar, minLength: 1, maxLength: 12 }).map((s) => `x-${s}`),
)
const extraHeaderValue = fc.oneof(
  fc.constantFrom('1', 'acme', 'globex', 'application/json', 'DELETE', 'PUT', '/admin', '/a/open/1', 'text/plain; charset=utf-8', '201', '204', '404', '409', '429', 'trailers', 'gzip'),
  // Accept as SDKs send it: the problem's media type follows (problemTypeFor).
  fc.constantFrom('application/problem+json', 'application/json;q=0.5, application/problem+json', 'application/json, application/problem+json;q=0.1', 'application/json;q=0', '*/*', 'application/*'),
  headerValue(60),
)
/** Connection must keep `close` (the raw client reads until the server closes). */
const connectionValue = rarely(fc.constantFrom('close', 'close, x-execution-fence', 'close, idempotency-key, x-account', 'x-execution-fence, close', 'CLOSE'), 6)

/**
 * A request the gateway and an upstream could read two ways (issue 27, docs/security.md "One
 * reading of a request"): a JSON key named twice, a query parameter given twice. Where the route
 * reads the value, or reads the body the key is in, it must be refused (`refused`); where it reads
 * neither, it is served as before. Which refusal a request gets, after the checks that come first,
 * is expectedRefusal's to say; `group` is for the generator's coverage. `{fresh}` is a new value:
 * an entity no fence was presented for yet, so a request that must be served is forwarded.
 */
interface Reading { group: 'json' | 'query'; refused: boolean; target: string; body: string }
const readings: Record<'a' | 'b', Reading[]> = {
  a: [
    // The entity's key twice: JSON.parse keeps the last, other parsers the first.
    { group: 'json', refused: true, target: 'POST /tickets', body: '{"ticket":{"id":"t1"},"ticket":{"id":"t2"}}' },
    { group: 'json', refused: true, target: 'POST /tickets', body: '{"ticket":{"id":"t1","id":"t1"}}' },
    // The same key as parsed, spelt two ways.
    { group: 'json', refused: true, target: 'POST /tickets', body: '{"ticket":{"id":"t1"},"\\u0074icket":{"id":"t2"}}' },
    // Another key twice in a body the route reads: the body is refused as a whole.
    { group: 'json', refused: true, target: 'POST /tickets', body: '{"ticket":{"id":"t1"},"note":1,"note":2}' },
    // Routes that read no value from the body.
    { group: 'json', refused: false, target: 'POST /payments/{fresh}/capture', body: '{"amount":1,"amount":2}' },
    { group: 'json', refused: false, target: 'POST /orders/1', body: '{"ticket":{"id":"t1"},"ticket":{"id":"t2"}}' },
    // The entity's parameter twice (read only with a fence: the route's fence is optional), and the key's.
    { group: 'query', refused: true, target: 'PUT /accounts/1?account=7&account=8', body: '' },
    { group: 'query', refused: true, target: 'PUT /accounts/1?account=7&account=7', body: '' },
    { group: 'query', refused: true, target: 'PUT /keyed/1?op={fresh}&op=o2', body: '' },
    // Parameters nothing reads.
    { group: 'query', refused: false, target: 'PUT /accounts/1?account={fresh}&x=1&x=2', body: '' },
    { group: 'query', refused: false, target: 'PUT /keyed/1?op={fresh}&x=1&x=1', body: '' },
    { group: 'query', refused: false, target: 'POST /orders/2?x=1&x=2', body: '{}' },
  ],
  b: [
    // The claimed tenant's key twice, with two values or one.
    { group: 'json', refused: true, target: 'POST /orders/1', body: '{"tenant":"acme","tenant":"globex"}' },
    { group: 'json', refused: true, target: 'POST /orders/1', body: '{"tenant":"acme","tenant":"acme"}' },
    { group: 'json', refused: true, target: 'POST /orders/1', body: '{"tenant":"acme","amount":1,"amount":2}' },
    { group: 'json', refused: false, target: 'POST /payments/{fresh}/capture', body: '{"tenant":"acme","tenant":"globex"}' },
    { group: 'json', refused: false, target: 'PUT /plain/{fresh}', body: '{"amount":1,"amount":2}' },
    { group: 'query', refused: false, target: 'POST /payments/{fresh}/capture?tenant=acme&tenant=globex', body: '' },
    { group: 'query', refused: false, target: 'PUT /plain/{fresh}?x=1&x=2', body: '' },
  ],
}

type RequestIdChoice = { kind: 'valid' | 'none' | 'invalid' | 'dup'; value: string }
interface Generated {
  mt: { method: string; target: string; wellFormed: boolean }
  fence: { kind: 'none' | 'one' | 'dup'; values: string[] }
  key: { kind: 'none' | 'one' | 'dup'; values: string[] }
  requestId: RequestIdChoice
  /** Token picks: `valid` picks among the tokens that authenticate (gateway B). */
  auth: { kind: 'none' | 'one' | 'dup'; picks: { valid: boolean; i: number }[] }
  /** X-Tenant on gateway B: absent, the token's own tenant, or another. */
  tenantClaim: 'none' | 'match' | 'other'
  extra: [string, string][]
  connection: string | null
  body: Uint8Array
  chunked: boolean
  malformedHeader: string | null
  /** Gateway G: what a browser (or a page rebinding its name) adds; null elsewhere. */
  browser: Browser | null
  /** Plausible requests only: their refusal is predicted (expectedRefusal). */
  predicted: boolean
  reading: Reading | null
  rewrite: boolean
}

/**
 * What reaches a plane without auth from a browser (src/http/browser-guard.ts), drawn from
 * lists whose verdict is known: `{port}` is G's port.
 */
interface Browser { host: string; site: string | null; origin: string; contentType: string | null }
const hostsServed = [hostHeader, 'Gateway.Test:{port}', '127.0.0.1:{port}', '127.0.0.1', 'localhost:{port}', 'LOCALHOST', '[::1]:{port}']
// A DNS-rebound page sends its own name; 127.0.0.2 and 0.0.0.0 reach loopback too but are no loopback name.
const hostsRefused = ['rebind.attacker.example:18081', 'gateway.test.attacker.example', '127.0.0.1.attacker.example:{port}', 'localhost.attacker.example', 'attacker.example', '127.0.0.2:{port}', '0.0.0.0:{port}']
const sitesServed = ['same-origin', 'none']
const sitesRefused = ['cross-site', 'same-site', 'Cross-Site']
// `same` is this very host and port as the request names it.
const originsRefused = ['http://rebind.attacker.example', 'null', 'http://127.0.0.1:1', 'https://attacker.example', 'http://gateway.test.attacker.example', 'file://', 'garbage']
const jsonTypes = ['application/json', 'application/json; charset=utf-8', 'Application/JSON', 'application/merge-patch+json']
// What a page may send without a CORS preflight, and near misses of JSON.
const otherTypes = ['text/plain', 'text/plain;charset=UTF-8', 'application/x-www-form-urlencoded', 'multipart/form-data; boundary=x', 'text/json', 'application/jsonx']
const browserArb: fc.Arbitrary<Browser> = fc.record({
  host: fc.oneof({ weight: 4, arbitrary: fc.constantFrom(...hostsServed) }, { weight: 1, arbitrary: fc.constantFrom(...hostsRefused) }),
  site: fc.oneof({ weight: 3, arbitrary: fc.constant(null) }, { weight: 2, arbitrary: fc.constantFrom(...sitesServed) }, { weight: 1, arbitrary: fc.constantFrom(...sitesRefused) }),
  origin: fc.oneof({ weight: 3, arbitrary: fc.constant('none') }, { weight: 2, arbitrary: fc.constant('same') }, { weight: 1, arbitrary: fc.constantFrom(...originsRefused) }),
  contentType: fc.oneof({ weight: 2, arbitrary: fc.constant(null) }, { weight: 3, arbitrary: fc.constantFrom(...jsonTypes) }, { weight: 2, arbitrary: fc.constantFrom(...otherTypes) }),
})

/** The guard's verdict on a request to G, from the lists above: host first, then the site, the origin, a job API body's type. */
function guardVerdict(b: Browser, method: string, target: string, hasBody: boolean): string | null {
  if (hostsRefused.includes(b.host)) return 'host_not_allowed'
  if (b.site !== null && sitesRefused.includes(b.site)) return 'cross_site_request'
  if (originsRefused.includes(b.origin)) return 'cross_site_request'
  let jobApi = false
  try {
    jobApi = new URL(target, 'http://gateway.test').pathname.startsWith(jobsPath)
  } catch {}
  const json = b.contentType !== null && jsonTypes.includes(b.contentType)
  if (jobApi && !['GET', 'HEAD', 'OPTIONS'].includes(method) && (b.contentType !== null ? !json : hasBody)) return 'unsupported_media_type'
  return null
}
const guardCodes = ['host_not_allowed', 'cross_site_request', 'unsupported_media_type']

const presence = <T>(value: fc.Arbitrary<T>) => fc.oneof(
  { weight: 2, arbitrary: fc.constant({ kind: 'none' as const, values: [] as T[] }) },
  { weight: 6, arbitrary: value.map((v) => ({ kind: 'one' as const, values: [v] })) },
  { weight: 1, arbitrary: fc.tuple(value, value).map((vs) => ({ kind: 'dup' as const, values: vs })) },
)

const pick = fc.record({ valid: fc.boolean(), i: fc.nat() })
const auth = (gw: Gw) => fc.oneof(
  { weight: gw === 'b' ? 1 : 3, arbitrary: fc.constant({ kind: 'none' as const, picks: [] as { valid: boolean; i: number }[] }) },
  { weight: 6, arbitrary: pick.map((p) => ({ kind: 'one' as const, picks: [p] })) },
  { weight: 1, arbitrary: fc.tuple(pick, pick).map((ps) => ({ kind: 'dup' as const, picks: ps })) },
)
const tenantClaim = fc.constantFrom('none' as const, 'match' as const, 'match' as const, 'other' as const)

/** Anything: every field drawn from its full range. */
const wild = (gw: Gw): fc.Arbitrary<Generated> => fc.record({
  mt: methodAndTarget(gw),
  fence: presence(fenceValue),
  key: presence(keyValue),
  requestId: requestIdValue,
  auth: auth(gw),
  tenantClaim,
  // G's Content-Type is the browser part's, so the guard's verdict is known.
  extra: fc.array(fc.tuple(extraHeaderName, extraHeaderValue), { maxLength: 5 }).map((e) => (gw === 'g' ? e.filter(([n]) => n !== 'content-type') : e)),
  connection: connectionValue,
  browser: gw === 'g' ? browserArb : fc.constant(null),
  body: body(gw),
  chunked: fc.boolean(),
  malformedHeader: fc.oneof(
    { weight: 40, arbitrary: fc.constant(null) },
    { weight: 1, arbitrary: fc.constantFrom('x-a: a\x01b', 'x-a: a\x7fb', 'x a: b', 'x-a: a\r\n b', `x-big: ${'a'.repeat(20_000)}`, 'x-execution-fence: 1\x00', 'content-length: 3', 'transfer-encoding: chunked', 'transfer-encoding: gzip, chunked') },
  ),
  predicted: fc.constant(false),
  reading: fc.constant(null),
  rewrite: fc.constant(false),
})

/** Plausible commands from a small pool, so fences compete, keys replay, collide and run concurrently. */
const plausible = (gw: Gw): fc.Arbitrary<Generated> => fc.record({
  target: fc.constantFrom(...(like(gw) === 'a'
    ? ['POST /orders/1', 'POST /orders/1', 'POST /orders/2?x=1', 'POST /payments/1/capture', 'POST /payments/2/capture', 'PUT /accounts/1?account=7', 'PATCH /h', 'POST /tickets', 'DELETE /open/1', 'GET /open/1', 'PUT /keyed/1?op=o1', 'PUT /keyed/2?op={fresh}']
    : ['POST /orders/1', 'POST /orders/2', 'POST /payments/1/capture', 'PUT /plain/1', 'PUT /plain/2'])),
  fence: fc.option(fc.nat(12).map(String), { freq: 4 }),
  // `fresh` becomes a key never used before, so keyed commands get forwarded too.
  key: fc.option(fc.constantFrom('k1', '"k1"', 'k2', '"k2"', 'k3', 'fresh', 'fresh', 'fresh', 'fresh', 'fresh'), { freq: 6 }),
  body: fc.constantFrom('', '{}', '{"ticket":{"id":"t1"}}', '{"ticket":{"id":2},"tenant":"acme"}'),
  status: fc.constantFrom('200', '200', '201', '204', '409', '429'),
  auth: pick.map((p) => ({ kind: 'one' as const, picks: [{ ...p, valid: true }] })),
  tenantClaim,
  // Now and then X-Account twice: joined, the gateway and the upstream read it differently, so it is refused.
  accounts: fc.constantFrom(['a1'], ['a1'], ['a1'], ['a1'], ['a1', 'a1'], ['a1', 'a2']),
  browser: gw === 'g' ? browserArb : fc.constant(null),
  // One in three has two readings in place of its target and body.
  reading: fc.oneof({ weight: 2, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.constantFrom(...readings[like(gw)]) }),
  rewrite: fc.constantFrom(false, false, false, true),
}).map(({ target, fence, key, body: b, status, auth: a, tenantClaim: tc, accounts, browser, reading, rewrite }) => {
  const [method, path] = (reading?.target ?? target).split(' ') as [string, string]
  return {
    mt: { method, target: path, wellFormed: true },
    fence: fence === null ? { kind: 'none' as const, values: [] } : { kind: 'one' as const, values: [fence] },
    key: key === null ? { kind: 'none' as const, values: [] } : { kind: 'one' as const, values: [key] },
    requestId: { kind: 'valid' as const, value: 'p' },
    auth: a,
    tenantClaim: tc,
    extra: [
      ...accounts.map((v) => ['x-account', v]), ['x-upstream-status', status],
      ...(rewrite ? [['X-HTTP-Method-Override', 'DELETE'], ['X-Original-URL', '/admin']] : []),
    ] as [string, string][],
    connection: null,
    body: new TextEncoder().encode(reading?.body ?? b),
    chunked: false,
    malformedHeader: null,
    browser,
    predicted: true,
    reading,
    rewrite,
  }
})

const generated = (gw: Gw): fc.Arbitrary<Generated> => fc.oneof({ weight: 3, arbitrary: wild(gw) }, { weight: like(gw) === 'a' ? 2 : 3, arbitrary: plausible(gw) })

/** Turns a generated description into the bytes' description, with a unique X-Request-Id where one is valid. */
function materialise(g: Generated, gw: Gw): RawRequest {
  const headers: [string, string][] = []
  for (const v of g.fence.values) headers.push(['X-Execution-Fence', v])
  for (const v of g.key.values) headers.push(['Idempotency-Key', v === 'fresh' ? `fresh-${++unique}` : v])
  const id = () => `${g.requestId.value}-u${++unique}`
  if (g.requestId.kind === 'valid') headers.push(['x-request-id', id()])
  else if (g.requestId.kind === 'invalid') headers.push(['x-request-id', g.requestId.value])
  else if (g.requestId.kind === 'dup') headers.push(['x-request-id', id()], ['X-Request-Id', id()])
  const valid = tokenChoices.filter((c) => c.tenant !== undefined)
  const auths = g.auth.picks.map((p) => (p.valid ? valid[p.i % valid.length]! : tokenChoices[p.i % tokenChoices.length]!))
  for (const a of auths) headers.push(['authorization', a.value])
  if (gw === 'b' && g.tenantClaim !== 'none') headers.push(['x-tenant', g.tenantClaim === 'match' ? (auths[0]?.tenant ?? 'acme') : 'nobody'])
  headers.push(...g.extra)
  if (g.connection !== null) headers.push(['connection', g.connection])
  const host = g.browser ? g.browser.host.replace('{port}', String(portG)) : hostHeader
  if (g.browser) {
    if (g.browser.site !== null) headers.push(['sec-fetch-site', g.browser.site])
    if (g.browser.origin !== 'none') headers.push(['origin', g.browser.origin === 'same' ? `http://${host}` : g.browser.origin])
    if (g.browser.contentType !== null) headers.push(['content-type', g.browser.contentType])
  }
  if (g.malformedHeader !== null) {
    const i = g.malformedHeader.indexOf(':')
    headers.push([g.malformedHeader.slice(0, i), g.malformedHeader.slice(i + 2)])
  }
  // One well-formed valid token authenticates; anything else must not reach the upstream (gateway B).
  const auth = gw !== 'b' ? { tenant: 'default', scopes: [] as string[] } : auths.length === 1 ? auths[0]! : { tenant: undefined, scopes: [] }
  const r: RawRequest = {
    method: g.mt.method,
    target: g.predicted ? g.mt.target.replace(/\{fresh\}/g, () => `fresh-${++unique}`) : g.mt.target,
    host,
    headers,
    body: g.body,
    chunked: g.chunked,
    wellFormed: g.mt.wellFormed && g.malformedHeader === null && headers.every(([, v]) => latin1(v)),
    tenant: auth.tenant,
    scopes: auth.scopes,
    ...(g.browser ? { guardRefuses: guardVerdict(g.browser, g.mt.method, g.mt.target, g.chunked || g.body.byteLength > 0) } : {}),
    ...(g.reading ? { reading: g.reading } : {}),
    ...(g.rewrite ? { rewrite: true } : {}),
  }
  if (g.predicted) r.expected = expectedRefusal(gw, r)
  return r
}

// ---------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------

const describeRequest = (r: RawRequest) => JSON.stringify({ method: r.method, target: r.target.slice(0, 300), headers: r.headers.map(([n, v]) => [n, v.slice(0, 200)]), body: Buffer.from(r.body).toString('latin1').slice(0, 200), chunked: r.chunked })

type Kind = 'forwarded' | 'replayed' | 'problem' | 'parser'

/**
 * The problem's media type a request should get (docs/http-contract.md): application/json
 * when its Accept names application/json and not application/problem+json at least as high
 * (a client such as node-zendesk reads no other); application/problem+json otherwise.
 */
function problemTypeFor(r: RawRequest): string {
  const ranges = r.headers.filter(([n]) => n.toLowerCase() === 'accept').flatMap(([, v]) => v.split(','))
  const q = (type: string) => Math.max(0, ...ranges.map((range) => range.split(';').map((p) => p.trim()))
    .filter(([t]) => t!.toLowerCase() === type)
    .map(([, ...params]) => {
      const qp = params.find((p) => /^q=/i.test(p))
      const value = qp === undefined ? 1 : Number(qp.slice(2))
      return value >= 0 && value <= 1 ? value : 0
    }))
  const json = q('application/json')
  return json > 0 && json > q('application/problem+json') ? 'application/json' : 'application/problem+json'
}

/** The refusals expectedRefusal models: a request it lets through must get none of them. */
const modelled = [...guardCodes, 'no_route', 'unauthenticated', 'insufficient_scope', 'invalid_request', 'invalid_fence', 'fence_required', 'idempotency_key_required', 'tenant_mismatch', 'entity_unresolved', 'unreadable_body']

/**
 * The refusal a plausible request must get, or null when it passes every check before the store
 * (which then forwards it, replays it, or refuses it as stale or a reused key). The order is the
 * gateway's: the browser guard (G), the route, the token and its scopes, then the command as
 * src/gateway/parse-command.ts reads it: a header the route reads sent twice, the fence, the key,
 * the claimed tenant, and the entity, resolved only when a fence was presented. The body is read
 * (and a body with two readings refused, issue 27) only when the key, the claim or the entity
 * reads it; a query parameter likewise only when one of them reads that parameter.
 */
function expectedRefusal(gw: Gw, r: RawRequest): string | null {
  if (r.guardRefuses) return r.guardRefuses
  const url = new URL(r.target, 'http://gateway.test')
  const shape = shapes[`/${gw}`].find((s) => s.method === r.method && s.pattern.test(url.pathname))
  if (!shape) return 'no_route'
  if (r.tenant === undefined) return 'unauthenticated'
  if (shape.scopes.some((scope) => !r.scopes.includes(scope))) return 'insufficient_scope'
  // A route that checks nothing streams its body unread.
  if (shape.fence === 'off' && !shape.idempotency && !shape.claim) return null
  if ((shape.once ?? []).some((name) => r.headers.filter(([n]) => n.toLowerCase() === name).length > 1)) return 'invalid_request'
  const readsBody = [shape.reads, shape.idempotency ? shape.key : undefined, shape.claim].some((source) => source?.[0] === 'body')
  let body: { value: unknown } | undefined
  const at = (path: string[]): unknown => {
    body ??= { value: bodyAsRead(r) }
    let node = body.value
    for (const key of path) node = node !== null && typeof node === 'object' && Object.hasOwn(node, key) ? (node as Record<string, unknown>)[key] : undefined
    return node
  }
  // A template's value, undefined when the request lacks it (absent, empty, or in the body not text).
  const read = (source: Source): string | undefined => {
    if (source[0] === 'params') return 'the matched segment'
    // A header key is then read by its grammar: the plausible keys all pass it.
    if (source[0] === 'header') return sentHeader(r, source[1]) || undefined
    if (source[0] === 'query') {
      if (url.searchParams.getAll(source[1]).length > 1) throw new Refusal('invalid_request')
      return url.searchParams.get(source[1]) || undefined
    }
    return bodyValue(at(source.slice(1)))
  }
  try {
    // The body's one reading comes first, before any field of it is looked at (src/gateway/parse-command.ts).
    if (readsBody) at([])
    const fence = shape.fence === 'off' ? undefined : sentHeader(r, 'x-execution-fence')
    if (fence !== undefined && !isFence(fence)) return 'invalid_fence'
    if (fence === undefined && shape.fence === 'required') return 'fence_required'
    if (shape.idempotency) {
      const key = read(shape.key ?? ['header', 'idempotency-key'])
      if (key === undefined && shape.idempotency === 'required') return 'idempotency_key_required'
    }
    if (shape.claim) {
      // A claim is compared as sent (a header), or as a body value: a string or a plain integer.
      const claimed = shape.claim[0] === 'body' ? bodyValue(at(shape.claim.slice(1))) : sentHeader(r, shape.claim[1])
      if (claimed !== undefined && claimed !== r.tenant) return 'tenant_mismatch'
    }
    if (fence !== undefined && shape.reads && read(shape.reads) === undefined) return 'entity_unresolved'
  } catch (err) {
    if (err instanceof Refusal) return err.code
    throw err
  }
  return null
}
class Refusal {
  constructor(readonly code: string) {}
}

/** A body value as a template or a claim reads it: a string or a safe integer; absent is undefined; anything else (null too) is unreadable. */
function bodyValue(node: unknown): string | undefined {
  if (node === undefined) return undefined
  if (typeof node === 'string') return node || undefined
  if (Number.isSafeInteger(node)) return String(node)
  throw new Refusal('unreadable_body')
}

/**
 * The body as the gateway reads it (docs/security.md "One reading of a request"): refused when
 * multipart, or declared as a form but JSON, or JSON naming a key twice; a form's fields (flat:
 * the plausible forms are empty), else the JSON value, undefined when it is not JSON.
 */
function bodyAsRead(r: RawRequest): unknown {
  if (r.body.byteLength === 0) return undefined
  const type = sentHeader(r, 'content-type')?.toLowerCase()
  if (type?.startsWith('multipart/')) throw new Refusal('unsupported_media_type')
  if (type?.split(';')[0]!.trim() === 'application/x-www-form-urlencoded') {
    if (/^(?:[ \t\r\n]|\xef\xbb\xbf)*[{[]/.test(Buffer.from(r.body).toString('latin1'))) throw new Refusal('unreadable_body')
    return Object.fromEntries(new URLSearchParams(Buffer.from(r.body).toString('utf8')))
  }
  if (namesAKeyTwice(r.body)) throw new Refusal('unreadable_body')
  const value = jsonOf(Buffer.from(r.body))
  // Not JSON (nor declared a form): refused, never read as naming nothing.
  if (value === undefined) throw new Refusal('unreadable_body')
  return value
}

/** A plausible request got the refusal expectedRefusal names, or none of the modelled ones. */
function checkPrediction(r: RawRequest, s: RawResponse, where: string): void {
  const forwardedOrReplayed = header(s, 'x-upstream-n') !== undefined || header(s, 'idempotent-replayed') !== undefined
  const code = forwardedOrReplayed ? undefined : (JSON.parse(s.body.toString('utf8')) as { code?: string }).code
  if (r.expected === null) {
    expect(modelled, `refused what passes every check before the store: ${where}`).not.toContain(code)
    return
  }
  expect(code, `expected ${r.expected}: ${where}`).toBe(r.expected)
  expect(s.status, where).toBe(problemCatalog[r.expected as keyof typeof problemCatalog].status)
}

/** Property 1 for one exchange: never 5xx, and every error is a catalogued problem. Returns what it was. */
function checkExchange(r: RawRequest, res: RawResponse | undefined): Kind {
  const where = `${describeRequest(r)}\n=> ${res ? `${res.status} ${JSON.stringify([...res.headers])} ${res.body.toString('latin1').slice(0, 300)}` : 'no response'}`
  if (!r.wellFormed) {
    // Node's parser may refuse it (400/431, no body) or close; fencegate answers the rest.
    if (res === undefined) return 'parser'
    expect(res.status, where).toBeLessThan(500)
    if (header(res, 'content-type') === undefined && header(res, 'x-request-id') === undefined) {
      expect([400, 431], where).toContain(res.status)
      return 'parser'
    }
  }
  expect(res, where).toBeDefined()
  expect(res!.complete, where).toBe(true)
  const s = res!
  expect(s.status, where).toBeLessThan(500)
  expect(header(s, 'x-request-id'), where).toBeDefined()
  if (r.guardRefuses !== undefined && r.wellFormed) checkGuard(r, s, where)
  if (r.expected !== undefined && r.wellFormed && r.method !== 'HEAD') checkPrediction(r, s, where)
  const n = header(s, 'x-upstream-n')
  if (n !== undefined) {
    expect(header(s, 'idempotent-replayed'), `an upstream cannot claim a replay: ${where}`).toBeUndefined()
    expect(s.status, where).toBe(upstreamStatus[Number(n)])
    return 'forwarded'
  }
  if (header(s, 'idempotent-replayed') !== undefined) {
    expect(header(s, 'idempotent-replayed'), where).toBe('true')
    return 'replayed'
  }
  expect(s.status, where).toBeGreaterThanOrEqual(400)
  expect(header(s, 'content-type'), where).toBe(problemTypeFor(r))
  if (r.method === 'HEAD') return 'problem'
  const problem = JSON.parse(s.body.toString('utf8')) as Record<string, unknown>
  expect(Object.keys(problemCatalog), where).toContain(problem.code)
  const code = problem.code as keyof typeof problemCatalog
  expect(problem.status, where).toBe(s.status)
  expect(problemCatalog[code].status, where).toBe(s.status)
  expect(problem.type, where).toBe(`urn:fencegate:problem:${code}`)
  expect(problem.request_id, where).toBe(header(s, 'x-request-id'))
  expect(['upstream_unreachable', 'upstream_timeout', 'store_unavailable', 'outcome_unknown', 'internal_error'], `healthy store and upstream: ${where}`).not.toContain(code)
  if (code === 'stale_fence') {
    expect(BigInt(problem.highest_fence as string) > BigInt(problem.presented_fence as string), where).toBe(true)
    const sent = r.headers.filter(([name]) => name.toLowerCase() === 'x-execution-fence').map(([, v]) => v.replace(/^[ \t]+|[ \t]+$/g, ''))
    expect(sent, where).toHaveLength(1)
    expect(problem.presented_fence, where).toBe(BigInt(sent[0]!).toString())
  }
  if (code === 'unauthenticated') expect(header(s, 'www-authenticate'), where).toMatch(/^Bearer realm="fencegate"/)
  return 'problem'
}

/**
 * Gateway G: a request the browser guard refuses gets that refusal (after the raw-target
 * guard's, which answers first), and one it lets through gets none of the guard's codes.
 */
function checkGuard(r: RawRequest, s: RawResponse, where: string): void {
  const expected = unsafeTarget(r.target) ? 'invalid_request' : r.guardRefuses!
  const problem = header(s, 'x-upstream-n') === undefined && header(s, 'idempotent-replayed') === undefined && r.method !== 'HEAD'
  const code = problem ? (JSON.parse(s.body.toString('utf8')) as { code?: string }).code : undefined
  if (expected === null) {
    // The guard's 415 is the job API's; on a route, a 415 is the route's own reading of the body (multipart, an encoding, a charset).
    const ownReading = code === 'unsupported_media_type' && !new URL(r.target, 'http://gateway.test').pathname.startsWith(jobsPath)
    if (!ownReading) expect(guardCodes, `the browser guard refused a request it should serve: ${where}`).not.toContain(code)
    return
  }
  expect(s.status, `the browser guard let through what it must refuse as ${expected}: ${where}`).toBe(problemCatalog[expected as keyof typeof problemCatalog].status)
  if (r.method !== 'HEAD') expect(code, where).toBe(expected)
}

/**
 * Property 2 over a batch: the upstream received exactly the forwarded requests; each
 * matches a configured route; on a fenced route it carries a fence the store accepted
 * (>= the entity's highest at that moment) for the entity the upstream sees; the tenant
 * is the token's; and no rejected request was ever accepted or forwarded.
 */
async function checkBatch(gw: Gw, sent: RawRequest[], got: (RawResponse | undefined)[], n0: number, seq0: string): Promise<Kind[]> {
  const kinds = sent.map((r, i) => checkExchange(r, got[i]))
  const byId = new Map<string, { r: RawRequest; res: RawResponse; kind: Kind }>()
  const claimed = new Map<number, string>()
  sent.forEach((r, i) => {
    const res = got[i]
    if (!res || kinds[i] === 'parser') return
    const id = header(res, 'x-request-id')!
    expect(byId.has(id), `request id ${id} answered twice`).toBe(false)
    byId.set(id, { r, res, kind: kinds[i]! })
    if (kinds[i] === 'forwarded') claimed.set(Number(header(res, 'x-upstream-n')), id)
  })
  const rows = await logSince(seq0)
  const accepted = acceptances(rows)
  const received = upstream.received.slice(n0)
  const readAccepted: { tenant: string; entity: string | undefined; fence: string; what: string }[] = []
  expect(received.length, 'the upstream received a request whose answer was not a forward').toBe(claimed.size)
  received.forEach((rec, i) => {
    const n = n0 + i + 1
    const id = rec.headers['x-request-id'] as string
    const what = `upstream #${n} ${rec.method} ${rec.path} ${JSON.stringify(rec.headers)}`
    expect(claimed.get(n), what).toBe(id)
    const { r } = byId.get(id)!
    const [pathname, ...q] = rec.path.split('?')
    const base = `/${gw}` as const
    expect(pathname!.startsWith(`${base}/`), what).toBe(true)
    let shape: Shape | undefined
    let m: RegExpExecArray | null = null
    for (const s of shapes[base]) {
      m = s.method === rec.method ? s.pattern.exec(pathname!.slice(base.length)) : null
      if (m) {
        shape = s
        break
      }
    }
    expect(shape, `not a configured route: ${what}`).toBeDefined()
    expect(r.tenant, `forwarded without authentication: ${what}`).toBeDefined()
    expect(rec.headers.authorization, `the caller's credentials reached the upstream: ${what}`).toBeUndefined()
    for (const name of rewritingHeaders) expect(rec.headers[name], `${name} reached the upstream: ${what}`).toBeUndefined()
    // A plausible request arrives as sent: a duplicate nobody reads is passed on, not dropped or merged.
    if (r.expected !== undefined) expect([rec.path, rec.body.toString('latin1')], what).toEqual([`${base}${r.target}`, Buffer.from(r.body).toString('latin1')])
    for (const scope of shape!.scopes) expect(r.scopes, what).toContain(scope)
    // Joined, two lines read as one value to the gateway and as the first to many upstreams.
    for (const name of shape!.once ?? []) expect(r.headers.filter(([n]) => n.toLowerCase() === name).length, `${name} sent twice was forwarded: ${what}`).toBeLessThanOrEqual(1)
    if (gw === 'b') {
      const claimedTenant = shape!.name === 'capture' ? rec.headers['x-tenant'] : bodyPath(rec.body, ['tenant'])
      if (shape!.name !== 'plain' && claimedTenant !== undefined) expect(String(claimedTenant), what).toBe(r.tenant)
    }
    const fence = rec.headers['x-execution-fence'] as string | undefined
    if (shape!.fence === 'required') expect(fence, `fenced route forwarded without a fence: ${what}`).toBeDefined()
    if (shape!.fence === 'off' || fence === undefined) return
    expect(isFence(fence), what).toBe(true)
    const row = accepted.get(id)
    const entity = shape!.entity!(m!, rec, new URLSearchParams(q.join('?')), r)
    if (row === undefined) {
      readAccepted.push({ tenant: r.tenant!, entity: entity === undefined ? undefined : wellFormed(entity), fence: BigInt(fence).toString(), what })
      return
    }
    expect(row.new_fence, what).toBe(BigInt(fence).toString())
    if (row.old_fence !== null) expect(BigInt(row.old_fence) <= BigInt(fence), what).toBe(true)
    expect(row.tenant, what).toBe(r.tenant)
    if (entity !== undefined) expect(row.entity, what).toBe(wellFormed(entity))
  })
  for (const a of readAccepted) expect(await raisedTo(a.tenant, a.entity, a.fence), `forwarded without an accepted fence: ${a.what}`).toBe(true)
  // A request the store rejected as stale never became the holder of a fence.
  for (const [id, { res, kind }] of byId) {
    if (kind !== 'problem' || res.status !== 409) continue
    const problem = JSON.parse(res.body.toString('utf8')) as { code: string }
    if (problem.code === 'stale_fence') expect(accepted.has(id), `stale request ${id} was accepted`).toBe(false)
  }
  // The fence log itself is one order per entity: each change starts from the previous highest and never lowers it.
  const last = new Map<string, string>()
  for (const row of rows) {
    const key = `${row.tenant}\0${row.entity}`
    const prev = last.get(key)
    if (prev !== undefined) expect(row.old_fence, JSON.stringify(row)).toBe(prev)
    if (row.old_fence !== null) expect(BigInt(row.new_fence) >= BigInt(row.old_fence), JSON.stringify(row)).toBe(true)
    last.set(key, row.new_fence)
  }
  expect(logged, 'the gateway logged an error or warning').toEqual([])
  expect(consoleError, 'something wrote to console.error').not.toHaveBeenCalled()
  return kinds
}

const stats = { requests: 0, forwarded: 0, replayed: 0, problem: 0, parser: 0 }
const codes = new Map<string, number>()
/** What requests with two readings, and with rewriting headers, got: `a json refused: invalid_request`, `a rewrite: forwarded`. */
const reached = new Map<string, number>()

/**
 * The generator reached, on this gateway, each refusal of issue 27 it is meant to exercise and
 * the requests that must still be served: otherwise a broken refusal could go unnoticed.
 */
function expectReadingsReached(gw: Gw): void {
  const wanted = [`${gw} rewrite: forwarded`]
  for (const group of ['json', 'query'] as const) {
    if (readings[like(gw)].some((x) => x.group === group && x.refused)) wanted.push(`${gw} ${group} refused: ${group === 'json' ? 'unreadable_body' : 'invalid_request'}`)
    if (readings[like(gw)].some((x) => x.group === group && !x.refused)) wanted.push(`${gw} ${group} served: forwarded`)
  }
  for (const what of wanted) expect(reached.get(what) ?? 0, `never reached ${what}: ${JSON.stringify([...reached])}`).toBeGreaterThan(0)
}

async function fuzz(gw: Gw, batch: Generated[]): Promise<void> {
  const sent = batch.map((g) => materialise(g, gw))
  const n0 = upstream.received.length
  const seq0 = await logSeq()
  const got = await Promise.all(sent.map((r) => rawSend({ a: portA, b: portB, g: portG }[gw], r)))
  stats.requests += sent.length
  const kinds = await checkBatch(gw, sent, got, n0, seq0)
  kinds.forEach((kind, i) => {
    stats[kind]++
    const res = got[i]
    const code = kind === 'problem' && sent[i]!.method !== 'HEAD' ? (JSON.parse(res!.body.toString('utf8')) as { code: string }).code : `${kind}${res ? ` ${res.status}` : ''}`
    codes.set(code, (codes.get(code) ?? 0) + 1)
    const { reading, rewrite } = sent[i]!
    const count = (what: string) => reached.set(what, (reached.get(what) ?? 0) + 1)
    if (reading) count(`${gw} ${reading.group} ${reading.refused ? 'refused' : 'served'}: ${kind === 'problem' ? code : kind}`)
    if (rewrite) count(`${gw} rewrite: ${kind === 'problem' ? code : kind}`)
  })
}

// ---------------------------------------------------------------------------
// The properties
// ---------------------------------------------------------------------------

describe('generated traffic through the real gateway', () => {
  it('gateway without auth: never a 5xx, every error a catalogued problem, forwarded only with an accepted fence', async () => {
    await fc.assert(fc.asyncProperty(fc.array(generated('a'), { minLength: 1, maxLength: 12 }), (batch) => fuzz('a', batch)), bounded(160))
    console.log(`gateway A: ${JSON.stringify(stats)}\n${JSON.stringify(Object.fromEntries([...codes].sort()))}\n${JSON.stringify(Object.fromEntries([...reached].filter(([k]) => k.startsWith('a ')).sort()))}`)
    codes.clear()
    expectReadingsReached('a')
  }, slow)

  it('gateway without auth behind the browser guard: the same, and a foreign Host, a cross-site page or a job API body that is not JSON is refused with its code', async () => {
    const before = { ...stats }
    codes.clear()
    await fc.assert(fc.asyncProperty(fc.array(generated('g'), { minLength: 1, maxLength: 12 }), (batch) => fuzz('g', batch)), bounded(120))
    console.log(`gateway G: ${JSON.stringify(Object.fromEntries(Object.entries(stats).map(([k, v]) => [k, v - before[k as keyof typeof stats]])))}\n${JSON.stringify(Object.fromEntries([...codes].sort()))}\n${JSON.stringify(Object.fromEntries([...reached].filter(([k]) => k.startsWith('g ')).sort()))}`)
    // The generator reaches every refusal of the guard, and traffic it serves.
    for (const code of [...guardCodes, 'forwarded 200']) expect(codes.get(code) ?? 0, code).toBeGreaterThan(0)
    codes.clear()
  }, slow)

  it('gateway with JWT auth: the same, and nothing unauthenticated, out of scope or of another tenant is forwarded', async () => {
    const before = { ...stats }
    await fc.assert(fc.asyncProperty(fc.array(generated('b'), { minLength: 1, maxLength: 12 }), (batch) => fuzz('b', batch)), bounded(90))
    console.log(`gateway B: ${JSON.stringify(Object.fromEntries(Object.entries(stats).map(([k, v]) => [k, v - before[k as keyof typeof stats]])))}\n${JSON.stringify(Object.fromEntries([...codes].sort()))}\n${JSON.stringify(Object.fromEntries([...reached].filter(([k]) => k.startsWith('b ')).sort()))}`)
    expectReadingsReached('b')
  }, slow)
})

// A fence as a client may write it: leading zeros are allowed within 19 digits.
const fenceArb = fc.oneof(
  { weight: 10, arbitrary: fc.bigInt({ min: 0n, max: 12n }) },
  { weight: 1, arbitrary: fc.bigInt({ min: 0n, max: maxFence }) },
  { weight: 1, arbitrary: fc.constantFrom(maxFence, maxFence - 1n, 2n ** 53n, 2n ** 53n + 1n) },
)
const written = (fence: bigint, zeros: number) => {
  const s = fence.toString()
  return s.length + zeros <= 19 ? '0'.repeat(zeros) + s : s
}

interface Command { tenant: 0 | 1 | 2; entity: number; fence: bigint; zeros: number }
const tenants = ['default', 'acme', 'globex'] as const

/** Sends one fenced command as tenant default (gateway A), acme or globex (gateway B). */
function sendCommand(c: Command, entity: string, requestId: string) {
  const headers: Record<string, string> = { 'x-request-id': requestId }
  if (c.tenant > 0) {
    const choice = c.tenant === 1 ? acmeW() : globexW()
    headers.authorization = choice.value
    headers['x-tenant'] = tenants[c.tenant]
  }
  const url = `${c.tenant === 0 ? gwA.url : gwB.url}/payments/${entity}/capture`
  return post(url, written(c.fence, c.zeros), { headers, body: JSON.stringify({ amount: Number(c.fence % 1000n) }) })
}

describe('the fence rule against a model', () => {
  it('sequential: accept iff fence >= the highest accepted for (tenant, entity), else 409 naming that highest', async () => {
    const command = fc.record({ tenant: fc.constantFrom(0 as const, 1 as const, 2 as const), entity: fc.nat(2), fence: fenceArb, zeros: fc.nat(2) })
    await fc.assert(fc.asyncProperty(fc.array(command, { minLength: 1, maxLength: 30 }), async (commands) => {
      const prefix = `m${++run}`
      const model = new Map<string, bigint>()
      for (const [i, c] of commands.entries()) {
        const entity = `${prefix}-${c.entity}`
        const key = `${tenants[c.tenant]}/${entity}`
        const n0 = upstream.received.length
        const res = await sendCommand(c, entity, `${prefix}-${i}`)
        const highest = model.get(key)
        const what = `${i}: ${JSON.stringify({ ...c, fence: String(c.fence) })} model=${highest} => ${res.status} ${res.text}`
        if (highest === undefined || c.fence >= highest) {
          expect(res.status, what).toBe(200)
          expect(upstream.received.length, what).toBe(n0 + 1)
          const rec = upstream.received[n0]!
          // The upstream gets the header exactly as sent, and the path the model named.
          expect(rec.headers['x-execution-fence'], what).toBe(written(c.fence, c.zeros))
          expect(rec.path, what).toBe(`/${c.tenant === 0 ? 'a' : 'b'}/payments/${entity}/capture`)
          model.set(key, c.fence)
        } else {
          expect(res.status, what).toBe(409)
          expect(res.json, what).toMatchObject({ code: 'stale_fence', entity: `invoice:${entity}`, presented_fence: String(c.fence), highest_fence: String(highest) })
          expect(upstream.received.length, what).toBe(n0)
        }
      }
      for (const [key, highest] of model) {
        const [tenant, entity] = key.split('/') as [string, string]
        expect((await t.store.getEntity(tenant, `invoice:${entity}`))?.highest_fence, key).toBe(String(highest))
      }
    }), bounded(60))
  }, slow)

  it('concurrent: one fence order per entity, the highest fence always wins, and only accepted fences are forwarded', async () => {
    const command = fc.record({ entity: fc.nat(2), fence: fc.nat(15) })
    await fc.assert(fc.asyncProperty(fc.array(command, { minLength: 2, maxLength: 40 }), async (commands) => {
      const prefix = `c${++run}`
      const n0 = upstream.received.length
      const seq0 = await logSeq()
      const outcomes = await Promise.all(commands.map(async (c, i) => {
        const requestId = `${prefix}-${i}`
        const res = await post(`${gwA.url}/payments/${prefix}-${c.entity}/capture`, String(c.fence), { headers: { 'x-request-id': requestId } })
        return { ...c, requestId, status: res.status, body: res.json }
      }))
      const rows = await logSince(seq0)
      const accepted = acceptances(rows)
      const forwarded = upstream.received.slice(n0)
      for (const e of new Set(commands.map((c) => c.entity))) {
        const entity = `invoice:${prefix}-${e}`
        const mine = outcomes.filter((o) => o.entity === e)
        const max = Math.max(...mine.map((o) => o.fence))
        const ok = mine.filter((o) => o.status === 200)
        const what = `${entity}: ${JSON.stringify(mine.map((o) => [o.fence, o.status]))}`
        for (const o of mine) expect([200, 409], what).toContain(o.status)
        // Nothing can be higher than the maximum, so every request presenting it is accepted.
        for (const o of mine.filter((o) => o.fence === max)) expect(o.status, what).toBe(200)
        expect((await t.store.getEntity('default', entity))?.highest_fence, what).toBe(String(max))
        const upstreamFences = forwarded.filter((r) => r.path === `/a/payments/${prefix}-${e}/capture`).map((r) => Number(r.headers['x-execution-fence']))
        expect(upstreamFences.sort((a, b) => a - b), what).toEqual(ok.map((o) => o.fence).sort((a, b) => a - b))
        for (const o of ok) {
          const row = accepted.get(o.requestId)
          if (row === undefined) {
            expect(await raisedTo('default', entity, String(o.fence)), `${what}: no acceptance recorded for ${o.requestId}`).toBe(true)
            continue
          }
          expect([row.entity, row.new_fence], what).toEqual([entity, String(o.fence)])
          if (row.old_fence !== null) expect(Number(row.old_fence) <= o.fence, what).toBe(true)
        }
        const okFences = new Set(ok.map((o) => String(o.fence)))
        for (const o of mine.filter((o) => o.status === 409)) {
          expect(o.body, what).toMatchObject({ code: 'stale_fence', presented_fence: String(o.fence) })
          expect(Number(o.body.highest_fence) > o.fence, what).toBe(true)
          expect(okFences.has(o.body.highest_fence), `${what}: ${o.body.highest_fence} was never accepted`).toBe(true)
          expect(accepted.has(o.requestId), what).toBe(false)
        }
        // Serialised per entity: every change starts where the previous one ended, never lower.
        const chain = rows.filter((r) => r.entity === entity)
        for (let i = 1; i < chain.length; i++) {
          expect(chain[i]!.old_fence, `${what}: ${JSON.stringify(chain)}`).toBe(chain[i - 1]!.new_fence)
          expect(BigInt(chain[i]!.new_fence) >= BigInt(chain[i - 1]!.new_fence), what).toBe(true)
        }
      }
      expect(forwarded).toHaveLength(outcomes.filter((o) => o.status === 200).length)
    }), bounded(40))
  }, slow)
})

describe('idempotency keys against a model', () => {
  // A payload is what the fingerprint covers: path, query and body (method and route are fixed).
  const payloads = [
    { path: '/orders/1', body: '{"amount":1}' },
    { path: '/orders/1', body: '{"amount":2}' },
    { path: '/orders/1', body: '' },
    { path: '/orders/1?x=1', body: '{"amount":1}' },
    { path: '/orders/2', body: '{"amount":1}' },
    { path: '/orders/2', body: '{"amount": 1}' },
  ]
  // Keys with characters that need escaping in an sf-string; the bare and quoted forms name one key.
  const keyNames = (prefix: string) => [`${prefix}-a`, `${prefix}-"b"`, `${prefix}-c\\d`]
  const present = (key: string, quoted: boolean) => (quoted ? `"${key.replace(/[\\"]/g, (c) => `\\${c}`)}"` : key)
  const use = fc.record({ key: fc.nat(2), payload: fc.nat(payloads.length - 1), quoted: fc.boolean() })
  const send = (key: string, quoted: boolean, p: number) => post(`${gwA.url}${payloads[p]!.path}`, undefined, { body: payloads[p]!.body, headers: { 'idempotency-key': present(key, quoted) } })

  it('sequential: each key executes once, its first payload replays byte for byte, any other payload is 422', async () => {
    await fc.assert(fc.asyncProperty(fc.array(use, { minLength: 1, maxLength: 25 }), async (uses) => {
      const keys = keyNames(`idem${++run}x`)
      const first = new Map<number, { payload: number; status: number; text: string; n: number }>()
      const n0 = upstream.received.length
      for (const [i, u] of uses.entries()) {
        const res = await send(keys[u.key]!, u.quoted, u.payload)
        const was = first.get(u.key)
        const what = `${i}: ${JSON.stringify(u)} first=${JSON.stringify(was)} => ${res.status} ${res.text}`
        if (!was) {
          expect(res.status, what).toBe(200)
          expect(res.headers.get('idempotent-replayed'), what).toBeNull()
          first.set(u.key, { payload: u.payload, status: res.status, text: res.text, n: Number(res.headers.get('x-upstream-n')) })
        } else if (was.payload === u.payload) {
          expect(res.status, what).toBe(was.status)
          expect(res.text, what).toBe(was.text)
          expect(res.headers.get('idempotent-replayed'), what).toBe('true')
          expect(res.headers.get('x-upstream-n'), what).toBeNull()
        } else {
          expect(res.status, what).toBe(422)
          expect(res.json.code, what).toBe('idempotency_key_reused')
        }
      }
      // Exactly one execution per key used, with that key's first payload.
      const received = upstream.received.slice(n0)
      expect(received).toHaveLength(first.size)
      for (const [k, f] of first) {
        const rec = upstream.received[f.n - 1]!
        expect([rec.path, rec.body.toString()]).toEqual([`/a${payloads[f.payload]!.path}`, payloads[f.payload]!.body])
        expect(rec.headers['idempotency-key'] === keys[k] || rec.headers['idempotency-key'] === present(keys[k]!, true)).toBe(true)
      }
    }), bounded(60))
  }, slow)

  it('concurrent: one execution per key; the executed payload gets that answer or 409 in progress, every other payload 422', async () => {
    await fc.assert(fc.asyncProperty(fc.array(use, { minLength: 2, maxLength: 24 }), async (uses) => {
      const keys = keyNames(`idem${++run}y`)
      const n0 = upstream.received.length
      const results = await Promise.all(uses.map(async (u) => ({ u, res: await send(keys[u.key]!, u.quoted, u.payload) })))
      const received = upstream.received.slice(n0)
      for (const k of new Set(uses.map((u) => u.key))) {
        const mine = results.filter((r) => r.u.key === k)
        const what = `${keys[k]}: ${JSON.stringify(mine.map((r) => [r.u.payload, r.res.status, r.res.headers.get('x-upstream-n')]))}`
        const owners = mine.filter((r) => r.res.headers.get('x-upstream-n') !== null)
        expect(owners, what).toHaveLength(1)
        const owner = owners[0]!
        const rec = upstream.received[Number(owner.res.headers.get('x-upstream-n')) - 1]!
        expect([rec.path, rec.body.toString()], what).toEqual([`/a${payloads[owner.u.payload]!.path}`, payloads[owner.u.payload]!.body])
        for (const r of mine) {
          if (r === owner) continue
          if (r.u.payload !== owner.u.payload) {
            expect([r.res.status, r.res.json?.code], what).toEqual([422, 'idempotency_key_reused'])
          } else if (r.res.status === 409) {
            expect(r.res.json.code, what).toBe('request_in_progress')
            expect(Number(r.res.headers.get('retry-after')), what).toBeGreaterThanOrEqual(1)
          } else {
            expect([r.res.status, r.res.text, r.res.headers.get('idempotent-replayed')], what).toEqual([owner.res.status, owner.res.text, 'true'])
          }
        }
        // Once settled, the executed payload replays the owner's answer.
        const again = await send(keys[k]!, !owner.u.quoted, owner.u.payload)
        expect([again.status, again.text, again.headers.get('idempotent-replayed')], what).toEqual([owner.res.status, owner.res.text, 'true'])
      }
      expect(received).toHaveLength(new Set(uses.map((u) => u.key)).size)
    }), bounded(30))
  }, slow)
})

describe('BUG: text that PostgreSQL cannot store', () => {
  // FAILS until src/ refuses such text itself: today the store rejects the statement (SQLSTATE
  // 22021) and the client gets 503 store_unavailable, with `store_failed` logged, although the
  // store is healthy. Minimal: POST /payments/%00/capture with X-Execution-Fence: 1 -> 503.
  // Sources: an entity from a path parameter, a query parameter or a JSON body (any client), and
  // the token's tenant or sub claim (the issuer; a NUL in sub fails every fenced request, because
  // the statement binds the caller for its audit insert even when it inserts nothing).
  it('an entity, tenant or caller containing NUL is never a 5xx', async () => {
    const text = fc.tuple(fc.string({ maxLength: 4 }), fc.string({ maxLength: 4 })).map(([a, b]) => `${a}\0${b}`)
    const sources = ['params', 'query', 'body', 'tenant', 'sub'] as const
    const put = async (url: string, fence: string) => {
      const res = await fetch(url, { method: 'PUT', headers: { 'x-execution-fence': fence } })
      return { status: res.status, text: await res.text() }
    }
    await fc.assert(fc.asyncProperty(fc.constantFrom(...sources), text, fc.nat(1000), async (source, s, fence) => {
      const entity = `nul${++run}`
      const res = source === 'params'
        ? await post(`${gwA.url}/payments/${encodeURIComponent(s)}/capture`, String(fence))
        : source === 'query'
          ? await put(`${gwA.url}/accounts/1?account=${encodeURIComponent(s)}`, String(fence))
          : source === 'body'
            ? await post(`${gwA.url}/tickets`, String(fence), { body: JSON.stringify({ ticket: { id: s } }) })
            : await post(`${gwB.url}/payments/${entity}/capture`, String(fence), {
              headers: { authorization: `Bearer ${await token(source === 'tenant' ? { tenant_id: s, scope: 'payments:write' } : { sub: s, scope: 'payments:write' })}` },
            })
      logged.length = 0
      expect(res.status, `${source} ${JSON.stringify(s)} => ${res.status} ${res.text}`).toBeLessThan(500)
    }), bounded(25))
  }, slow)
})
