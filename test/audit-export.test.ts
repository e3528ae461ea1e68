import { describe, expect, it } from 'vitest'
import { csvCell } from '../src/admin/audit-export.js'
import { backends } from './helpers/backends.js'
import { freshGateway } from './helpers/fresh-gateway.js'
import { post, route, testConfig } from './helpers/gateway.js'

/** Parses RFC 4180 CSV (quoted cells, doubled quotes, CRLF rows). */
function parseCsv(text: string): string[][] {
  const rows: string[][] = []
  let row: string[] = []
  let cell = ''
  let quoted = false
  for (let i = 0; i < text.length; i++) {
    const ch = text[i]!
    if (quoted) {
      if (ch === '"' && text[i + 1] === '"') { cell += '"'; i++ } else if (ch === '"') quoted = false
      else cell += ch
    } else if (ch === '"') quoted = true
    else if (ch === ',') { row.push(cell); cell = '' } else if (ch === '\r' && text[i + 1] === '\n') { row.push(cell); rows.push(row); row = []; cell = ''; i++ } else cell += ch
  }
  return rows
}

describe.each(backends())('audit export and summary ($name)', (backend) => {
  const fx = freshGateway(backend, ({ upstream }) => ({ config: testConfig([route(upstream.url)]) }))

  /** n audit rows, the newest with the highest id; every third one in tenant acme. */
  const seed = (n: number) => fx.t.db.sql`
    INSERT INTO fg_audit (tenant, route, entity, code, method, path, caller, request_id)
    SELECT CASE WHEN i % 3 = 0 THEN 'acme' ELSE 'default' END, 'capture', 'invoice:' || i, 'stale_fence', 'POST', '/p/' || i, 'w', 'seed-' || i
    FROM generate_series(1, ${n}::integer) AS i`

  it('streams every matching row as NDJSON across many store pages, newest first, without repeats', async () => {
    await seed(1203)
    const res = await fetch(`${fx.gw.adminUrl}/audit?tenant=default`, { headers: { accept: 'application/x-ndjson' } })
    expect(res.status).toBe(200)
    expect(res.headers.get('content-type')).toBe('application/x-ndjson')
    const lines = (await res.text()).split('\n')
    expect(lines.pop()).toBe('')
    const items = lines.map((l) => JSON.parse(l))
    expect(items).toHaveLength(802)
    const ids = items.map((i) => BigInt(i.id))
    expect(ids.every((id, k) => k === 0 || id < ids[k - 1]!)).toBe(true)
    expect(items.every((i) => i.tenant === 'default')).toBe(true)
    expect(Object.keys(items[0])).toEqual(Object.keys((await fx.t.store.listAudit({ limit: 1 }))[0]!))
  })

  it('exports CSV with ?format=csv, honouring limit, cursor and filters', async () => {
    await seed(30)
    const all = await (await fetch(`${fx.gw.adminUrl}/audit?format=csv`)).text()
    const rows = parseCsv(all)
    expect(rows[0]).toEqual(['id', 'at', 'tenant', 'route', 'entity', 'code', 'presented_fence', 'highest_fence', 'method', 'path',
      'body_sha256', 'caller', 'request_id', 'idempotency_key', 'trace_id', 'trace_from_caller'])
    expect(rows).toHaveLength(31)
    const res = await fetch(`${fx.gw.adminUrl}/audit?format=csv&limit=5&cursor=${rows[1]![0]}&tenant=acme`)
    expect(res.headers.get('content-type')).toBe('text/csv; charset=utf-8')
    expect(res.headers.get('content-disposition')).toContain('attachment')
    const page = parseCsv(await res.text()).slice(1)
    expect(page.map((r) => r[12])).toEqual(['seed-27', 'seed-24', 'seed-21', 'seed-18', 'seed-15'])
  })

  it('an empty export is a header line (CSV) or nothing (NDJSON)', async () => {
    expect(parseCsv(await (await fetch(`${fx.gw.adminUrl}/audit?format=csv`)).text())).toHaveLength(1)
    expect(await (await fetch(`${fx.gw.adminUrl}/audit`, { headers: { accept: 'application/x-ndjson' } })).text()).toBe('')
  })

  it('quotes CSV cells and defuses spreadsheet formulas that come from clients', async () => {
    expect(csvCell(null)).toBe('')
    expect(csvCell('plain')).toBe('plain')
    expect(csvCell('a,"b"')).toBe('"a,""b"""')
    expect(csvCell('=HYPERLINK("x")')).toBe('"\'=HYPERLINK(""x"")"')
    expect(csvCell('@cmd')).toBe("'@cmd")
    await fx.t.db.sql`INSERT INTO fg_audit (tenant, entity, code, method, path, request_id) VALUES ('default', '=cmd|x', 'invalid_fence', 'POST', '/p', 'r"1')`
    const rows = parseCsv(await (await fetch(`${fx.gw.adminUrl}/audit?format=csv`)).text())
    expect([rows[1]![4], rows[1]![12]]).toEqual(["'=cmd|x", 'r"1'])
  })

  it('refuses an unknown format with invalid_query, and JSON stays the default', async () => {
    const bad = await fetch(`${fx.gw.adminUrl}/audit?format=xml`)
    expect([bad.status, ((await bad.json()) as any).code]).toEqual([400, 'invalid_query'])
    const page = await fetch(`${fx.gw.adminUrl}/audit`, { headers: { accept: 'text/html,*/*' } })
    expect(page.headers.get('content-type')).toContain('application/json')
  })

  it('counts rejections by code per bucket on the database clock, with the same filters', async () => {
    await post(`${fx.gw.url}/payments/1/capture`, '5')
    for (const f of ['4', '3']) await post(`${fx.gw.url}/payments/1/capture`, f)
    await post(`${fx.gw.url}/payments/1/capture`, 'bad')
    await post(`${fx.gw.url}/payments/2/capture`, 'bad')
    // Two hours ago: outside the default window of one hour.
    await fx.t.db.sql`INSERT INTO fg_audit (at, tenant, code, method, path, request_id) VALUES (now() - interval '2 hours', 'default', 'stale_fence', 'POST', '/old', 'old')`
    const [now] = await fx.t.db.sql<{ ms: string }>`SELECT (floor(extract(epoch FROM now()) * 1000 / 3600000)::bigint * 3600000)::text AS ms`
    const summary = await (await fetch(`${fx.gw.adminUrl}/audit/summary?bucket_ms=3600000`)).json() as any
    expect(summary.bucket_ms).toBe(3600000)
    const counts = Object.fromEntries(summary.buckets.map((b: any) => [b.code, b.count]))
    expect(counts).toEqual({ invalid_fence: 2, stale_fence: 2 })
    expect(summary.buckets.every((b: any) => b.at === new Date(Number(now!.ms)).toISOString() || b.at === new Date(Number(now!.ms) - 3600000).toISOString())).toBe(true)
    const narrowed = await (await fetch(`${fx.gw.adminUrl}/audit/summary?entity=invoice:2&since=1d`)).json() as any
    expect(narrowed.bucket_ms).toBe(60000)
    expect(narrowed.buckets).toEqual([expect.objectContaining({ code: 'invalid_fence', count: 1 })])
    const wide = await (await fetch(`${fx.gw.adminUrl}/audit/summary?since=1d&code=stale_fence&bucket_ms=86400000`)).json() as any
    expect(wide.buckets.reduce((n: number, b: any) => n + b.count, 0)).toBe(3)
    for (const q of ['bucket_ms=999', 'bucket_ms=86400001', 'bucket_ms=x', 'limit=5', 'since=yesterday']) {
      const res = await fetch(`${fx.gw.adminUrl}/audit/summary?${q}`)
      expect([q, res.status]).toEqual([q, 400])
    }
  })
})
