// The bench's MCP cases (issue 42): wrk sends an agent's tools/call as described in
// docs/benchmarks.md, a new JSON-RPC id and key per call, and the report checks fg-mcp's
// gateway CPU per call against fg-key's within each round. Beside test/bench.test.ts, which is
// long enough.
import { spawnSync } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { createServer, type IncomingHttpHeaders } from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { cases } from '../bench/cases.js'
import { runLoad } from '../bench/load.js'
import type { Sample } from '../bench/measure.js'
import { targets, type Results } from '../bench/report.js'
import { baseHeaders, mcpCall, requests, type Traffic } from '../bench/traffic.js'

const sample = (round: number, proxyUs: number): Sample => ({
  round,
  load: { requests: 10_000, seconds: 10, rps: 1000, p50ms: 1, p99ms: 10, non2xx: 0, errors: 0, cpuSeconds: 0 },
  cpu: { proxy: proxyUs * 10_000 / 1e6, upstream: 0, postgres: 0, postgresAll: 0, load: 0, machineBusy: 0 },
  connections: 4,
})

describe('the bench report\'s MCP target', () => {
  it('takes fg-mcp\'s gateway CPU per call over fg-key\'s within each round, median over rounds', () => {
    // Round 2 ran on a slower machine: both cases' CPU per call rose together.
    const results: Results = new Map([
      ['fg-key', [sample(1, 400), sample(2, 800)]],
      ['fg-mcp', [sample(1, 480), sample(2, 1000)]],
    ])
    const check = targets(results, cases, undefined, true).find((t) => t.target === 'fg-mcp gateway CPU/call <= 1.3x fg-key\'s')
    expect(check).toEqual({ target: 'fg-mcp gateway CPU/call <= 1.3x fg-key\'s', measured: '1.23×', met: true })
  })
})

describe('fg-mcp-upstream: the MCP route answered by the bench upstream', () => {
  it('sends fg-mcp\'s calls to the route in front of the bench upstream, and checks its gateway CPU against fg-key\'s', () => {
    const c = cases.find((x) => x.name === 'fg-mcp-upstream')!
    expect([c.system, c.upstream, c.traffic]).toEqual(['gateway', undefined, { path: '/mcp-upstream', entity: 'spread', key: 'meta' }])
    const results: Results = new Map([['fg-key', [sample(1, 400), sample(2, 500)]], ['fg-mcp-upstream', [sample(1, 480), sample(2, 700)]]])
    // Within each round: 1.2x and 1.4x, median 1.3x.
    expect(targets(results, cases, undefined, true).find((t) => t.target.startsWith('fg-mcp-upstream gateway CPU/call'))).toEqual({
      target: 'fg-mcp-upstream gateway CPU/call <= 1.3x fg-key\'s (the MCP route without an MCP server on the cores)', measured: '1.30×', met: true,
    })
  })
})

describe('fg-mcp-rest: the same calls through a REST route with a key', () => {
  it('sends fg-mcp\'s body to /rest-mcp/<invoice>, the fence and the same key as headers', () => {
    const traffic: Traffic = { path: '/rest-mcp/{id}', entity: 'spread', key: 'meta-rest', ids: 10, replayKeys: 5, keyPrefix: 'k.', replayPrefix: 'r.', fence: '42' }
    const next = requests(traffic)
    for (const n of [0, 1]) {
      const o = next()
      const invoice = /^\/rest-mcp\/(\d+)$/.exec(o.path)![1]!
      expect(o.body).toBe(mcpCall(invoice, n, '42', 'k.'))
      expect(o.headers).toEqual({ 'idempotency-key': `k.${n}` })
    }
    expect(baseHeaders(traffic)).toMatchObject({ 'X-Execution-Fence': '42', 'mcp-method': 'tools/call', 'mcp-protocol-version': '2026-07-28' })
  })

  it('the report sets fg-mcp\'s gateway CPU per call beside fg-mcp-rest\'s as well', () => {
    const results: Results = new Map([['fg-mcp-rest', [sample(1, 1000)]], ['fg-mcp', [sample(1, 1100)]]])
    expect(targets(results, cases, undefined, true).find((t) => t.target === 'fg-mcp gateway CPU/call <= 1.3x fg-mcp-rest\'s')).toEqual({ target: 'fg-mcp gateway CPU/call <= 1.3x fg-mcp-rest\'s', measured: '1.10×', met: true })
  })
})

describe.skipIf(spawnSync('wrk', ['--version']).error !== undefined)('the MCP cases\' traffic through wrk', () => {
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-test-wrk-mcp-'))
  afterAll(() => rmSync(dir, { recursive: true, force: true }))

  it('POSTs a tools/call to /mcp with a new id and a new _meta key per call, the fence in _meta, the 2026-07-28 headers and no fence header', async () => {
    const seen: { url: string; headers: IncomingHttpHeaders; body: string }[] = []
    const server = createServer((req, res) => {
      let body = ''
      req.setEncoding('utf8')
      req.on('data', (c: string) => { body += c })
      req.on('end', () => {
        seen.push({ url: req.url!, headers: req.headers, body })
        res.writeHead(200, { 'content-length': 2 }).end('{}')
      })
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    const traffic: Traffic = { path: '/mcp', entity: 'spread', key: 'meta', ids: 10, replayKeys: 5, keyPrefix: 'k.', replayPrefix: 'r.', fence: '42' }
    try {
      await runLoad('wrk', { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, connections: 2, seconds: 1, traffic, dir, signal: new AbortController().signal })
    } finally {
      server.closeAllConnections()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    }
    expect(seen.length).toBeGreaterThan(1)
    const calls = seen.map((s) => JSON.parse(s.body) as { id: number; params: { arguments: { invoice_id: string }; _meta: Record<string, unknown> } })
    for (const [i, s] of seen.entries()) {
      const call = calls[i]!
      expect(s.url).toBe('/mcp')
      expect(s.body).toBe(mcpCall(call.params.arguments.invoice_id, call.id, '42', 'k.'))
      expect(Number(call.params.arguments.invoice_id)).toBeLessThan(10)
      expect(call.params._meta).toMatchObject({ 'io.fencegate/fence': '42', 'io.fencegate/idempotency-key': `k.${call.id}` })
      expect(s.headers).toMatchObject({ 'content-type': 'application/json', 'mcp-protocol-version': '2026-07-28', 'mcp-method': 'tools/call', 'mcp-name': 'capture_payment' })
      expect(s.headers['x-execution-fence']).toBeUndefined()
    }
    // wrk's one thread counts the calls of all its connections: no id or key is sent twice.
    expect(new Set(calls.map((c) => c.id)).size).toBe(seen.length)
    expect(new Set(calls.map((c) => c.params._meta['io.fencegate/idempotency-key'])).size).toBe(seen.length)
  })
})
