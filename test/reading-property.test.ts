/**
 * The principle of one reading, as a property (issue 41, item 6): requests generated in every
 * encoding the review used (Content-Encoding, charsets, UTF-16 with and without a charset,
 * invalid bytes, lenient JSON, forms that are JSON, names in another case, numbers beyond
 * 2^53, headers with `_`), sent with a tenant-A token to a real gateway in front of a real
 * upstream. An oracle says which the gateway must refuse; the upstream reads every request it
 * receives with the stock readers an upstream would use (the body decoded as its headers say,
 * Python's UTF-16 detection, then `JSON.parse` or `URLSearchParams`, and a second reader that
 * matches names in any case), and must never see another tenant or another ticket than the one
 * the gateway decided on (the entity its fence was recorded for).
 */
import { deflateSync, gunzipSync, gzipSync, inflateSync } from 'node:zlib'
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { backends } from './helpers/backends.js'
import { sharedGateway } from './helpers/fresh-gateway.js'
import { rawPost, route, testConfig } from './helpers/gateway.js'
import { bearer, hmacAuthenticator, jwtAuth } from './helpers/tokens.js'

interface Shape {
  form: boolean
  /** How the tenant is named: exactly, in another case, or both. */
  tenantName: 'tenant_id' | 'TENANT_ID' | 'both'
  tenant: 'A' | 'B' | 'huge' | 'none'
  ticket: 'T1' | 'T2'
  lenient: boolean
  /** A JSON body sent as a form, hiding form fields in a string. */
  jsonAsForm: boolean
  encoding: 'none' | 'gzip' | 'deflate'
  charset: 'none' | 'utf-8' | 'utf-16le' | 'iso-8859-1'
  bytes: 'as-declared' | 'utf-16-undeclared' | 'invalid-byte'
  underscoreHeader: boolean
}

const shapes: fc.Arbitrary<Shape> = fc.record({
  form: fc.boolean(),
  tenantName: fc.constantFrom('tenant_id', 'TENANT_ID', 'both'),
  tenant: fc.constantFrom('A', 'B', 'huge', 'none'),
  ticket: fc.constantFrom('T1', 'T2'),
  lenient: fc.boolean(),
  jsonAsForm: fc.boolean(),
  encoding: fc.constantFrom('none', 'none', 'gzip', 'deflate'),
  charset: fc.constantFrom('none', 'utf-8', 'utf-16le', 'iso-8859-1'),
  bytes: fc.constantFrom('as-declared', 'as-declared', 'utf-16-undeclared', 'invalid-byte'),
  underscoreHeader: fc.boolean(),
})

/** The body's text, before it is encoded. */
function text(s: Shape): string {
  const tenant = s.tenant === 'huge' ? 9007199254740993 : s.tenant
  const fields: [string, unknown][] = [['ticket_id', s.ticket]]
  if (s.tenant !== 'none') {
    if (s.tenantName !== 'TENANT_ID') fields.unshift(['tenant_id', s.tenant === 'B' ? 'B' : s.tenantName === 'both' ? 'A' : tenant])
    if (s.tenantName !== 'tenant_id') fields.push(['TENANT_ID', tenant])
  }
  if (s.form && !s.jsonAsForm) return fields.map(([k, v]) => `${k}=${String(v)}`).join('&')
  const json = `{${fields.map(([k, v]) => `${JSON.stringify(k)}:${typeof v === 'number' ? String(v) : JSON.stringify(v)}`).join(',')}${s.jsonAsForm ? ',"x":"&tenant_id=A&ticket_id=T9&y="' : ''}${s.lenient ? ',' : ''}}`
  return json
}

function encode(s: Shape): { headers: Record<string, string>; body: Uint8Array } {
  const t = text(s)
  let bytes = s.charset === 'utf-16le' || s.bytes === 'utf-16-undeclared' ? Buffer.from(t, 'utf16le') : s.charset === 'iso-8859-1' ? Buffer.from(t, 'latin1') : Buffer.from(t)
  if (s.bytes === 'invalid-byte') bytes = Buffer.concat([bytes.subarray(0, bytes.length - 1), Buffer.from([0x20, 0xff, 0x20]), bytes.subarray(bytes.length - 1)])
  if (s.encoding === 'gzip') bytes = gzipSync(bytes)
  if (s.encoding === 'deflate') bytes = deflateSync(bytes)
  const type = s.form ? 'application/x-www-form-urlencoded' : 'application/json'
  const headers: Record<string, string> = { 'content-type': s.charset === 'none' ? type : `${type}; charset=${s.charset}` }
  if (s.encoding !== 'none') headers['content-encoding'] = s.encoding
  return { headers, body: new Uint8Array(bytes) }
}

/** What the gateway must do: refuse (and with which status), or forward. */
function oracle(s: Shape): number {
  // Headers are read before the body.
  if (s.underscoreHeader) return 400
  if (s.encoding !== 'none' || (s.charset !== 'none' && s.charset !== 'utf-8')) return 415
  if (s.bytes !== 'as-declared') return 400
  if (s.form && s.jsonAsForm) return 400
  if (!s.form && s.lenient) return 400
  if (s.tenant !== 'none' && s.tenantName !== 'tenant_id') return 400
  if (s.tenant === 'huge' && !s.form) return 400
  if (s.tenant === 'B' || (s.tenant === 'huge' && s.form)) return 403
  return 200
}

/** The stock readers: the body decoded as its headers say (Python's UTF-16 detection too), then parsed; exact names, or names in any case. */
function upstreamReadings(headers: Record<string, unknown>, body: Buffer): { tenant: unknown; ticket: unknown }[] {
  const encoding = String(headers['content-encoding'] ?? 'identity')
  const raw = encoding === 'gzip' ? gunzipSync(body) : encoding === 'deflate' ? inflateSync(body) : body
  const type = String(headers['content-type'] ?? '')
  const charset = /charset=([^;]+)/.exec(type)?.[1] ?? (raw[1] === 0 ? 'utf-16le' : 'utf-8')
  const decoded = new TextDecoder(charset).decode(raw)
  const fields: Record<string, unknown> = type.startsWith('application/x-www-form-urlencoded')
    ? Object.fromEntries(new URLSearchParams(decoded))
    : JSON.parse(decoded)
  const anyCase = (name: string) => Object.entries(fields).find(([k]) => k.toLowerCase() === name)?.[1]
  return [{ tenant: fields.tenant_id, ticket: fields.ticket_id }, { tenant: anyCase('tenant_id'), ticket: anyCase('ticket_id') }]
}

describe('property: what the upstream reads is what the gateway decided on', () => {
  const fx = sharedGateway(backends()[0]!, async ({ upstream }) => ({
    config: testConfig([
      route(upstream.url, { name: 'tickets', path: '/tickets', entity: 'ticket:{body.ticket_id}', claimed_tenant: 'body.tenant_id', idempotency: 'off' }),
    ], { auth: jwtAuth }),
    authenticate: await hmacAuthenticator(),
  }))
  let fence = 0
  let forwarded = 0

  it('never forwards a request whose tenant or ticket a stock reader reads otherwise, and refuses exactly what the oracle says', async () => {
    await fc.assert(fc.asyncProperty(shapes, async (s) => {
      const { headers, body } = encode(s)
      const before = fx.upstream.received.length
      fence++
      const sent = { ...headers, ...await bearer({ tenant_id: 'A' }), 'x-execution-fence': String(fence), ...(s.underscoreHeader ? { x_execution_fence: '1' } : {}) }
      const res = await rawPost(`${fx.gw.url}/tickets`, sent, body)
      expect(res.status, JSON.stringify(s)).toBe(oracle(s))
      if (res.status !== 200) {
        expect(fx.upstream.received.length).toBe(before)
        return
      }
      forwarded++
      const received = fx.upstream.received[before]!
      const [decided] = await fx.t.db.sql<{ entity: string }>`SELECT entity FROM fg_fences WHERE request_id = ${String(res.headers['x-request-id'])}`
      for (const reading of upstreamReadings(received.headers, received.body)) {
        expect([undefined, 'A']).toContain(reading.tenant)
        expect(`ticket:${String(reading.ticket)}`).toBe(decided!.entity)
      }
    }), { numRuns: 300 })
    // The generator reaches the upstream, or the second half of the property says nothing.
    expect(forwarded).toBeGreaterThan(0)
  })
})
