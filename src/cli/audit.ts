import { Writable } from 'node:stream'
import { parseAuditQuery, readAuditPage, type AuditPage } from '../admin/app.js'
import { auditLines, exportAudit } from '../admin/audit-export.js'
import { parseDuration } from '../config/units.js'
import { openDb } from '../runtime/node/gateway.js'
import { FencegateError } from '../http/problems.js'
import type { AuditItem } from '../store/audit.js'
import { createStore } from '../store/store.js'
import { adminCall, AdminError, adminUrlOf } from './admin-client.js'
import { stringFlag, storeLocation, UsageError, type Flags } from './usage.js'

// Flag and query parameter alike, but --trace-id is ?trace_id=.
const filters = ['tenant', 'entity', 'code', 'route', 'caller', 'trace-id', 'since', 'until', 'limit', 'cursor'] as const
const formats = ['table', 'json', 'ndjson', 'csv'] as const
type Format = (typeof formats)[number]

/**
 * `fencegate audit`: reads the audit trail from the database, or from a running
 * gateway's admin plane with --admin-url (the embedded store admits one process).
 * `--format ndjson|csv` exports every matching row; `--follow` tails new
 * rejections from the admin plane.
 */
export async function runAudit(flags: Flags): Promise<number> {
  const params = new URLSearchParams()
  for (const f of filters) {
    const v = stringFlag(flags, f)
    if (v !== undefined) params.set(f.replace('-', '_'), v)
  }
  const format = formatOf(flags)
  if (flags.follow) return follow(flags, params, format)
  const adminUrl = stringFlag(flags, 'admin-url')
  const token = stringFlag(flags, 'token') ?? process.env.FENCEGATE_TOKEN
  if (format === 'ndjson' || format === 'csv') {
    params.set('format', format)
    const out = () => Writable.toWeb(process.stdout)
    // preventClose: stdout stays open for the exit code's flush.
    if (adminUrl) await (await fromAdmin(adminUrl, params, token)).body?.pipeTo(out(), { preventClose: true })
    else await fromDatabase(flags, params, async (store, query) => (await exportAudit(store, query, format, params.has('limit') ? query.limit : undefined)).body?.pipeTo(out(), { preventClose: true }))
    return 0
  }
  const page = adminUrl
    ? await (await fromAdmin(adminUrl, params, token)).json() as AuditPage
    : await fromDatabase(flags, params, (store, query) => readAuditPage(store, query))
  if (format === 'json') {
    console.log(JSON.stringify(page, null, 2))
    return 0
  }
  console.log(tableHeader)
  for (const i of page.items) console.log(tableLine(i))
  if (page.next_cursor) console.log(`more: --cursor ${page.next_cursor}`)
  return 0
}

function formatOf(flags: Flags): Format {
  const f = stringFlag(flags, 'format') ?? (flags.json ? 'json' : 'table')
  if (!(formats as readonly string[]).includes(f)) throw new UsageError(`--format must be one of ${formats.join(', ')}, got ${JSON.stringify(f)}`)
  return f as Format
}

// `trace_from`: whose trace id it is, `caller` (its traceparent chose it) or `gateway`.
const tableHeader = ['at', 'code', 'route', 'entity', 'presented', 'highest', 'request', 'trace', 'trace_from'].join('\t')
const traceFrom = (i: AuditItem) => (i.trace_from_caller === null ? '-' : i.trace_from_caller ? 'caller' : 'gateway')
const tableLine = (i: AuditItem) =>
  [i.at, i.code, i.route ?? '-', i.entity ?? '-', i.presented_fence ?? '-', i.highest_fence ?? '-', `${i.method} ${i.path} ${i.request_id}`, i.trace_id ?? '-', traceFrom(i)].join('\t')

async function fromDatabase<T>(flags: Flags, params: URLSearchParams, read: (store: ReturnType<typeof createStore>, query: ReturnType<typeof parseAuditQuery>) => Promise<T>): Promise<T> {
  let query
  try {
    query = parseAuditQuery(params)
  } catch (err) {
    if (err instanceof FencegateError) throw new UsageError(err.detail.replace(/^(\w+)/, (name) => `--${name.replace('_', '-')}`))
    throw err
  }
  const { url, dataDir } = storeLocation(flags, process.env)
  const store = createStore(await openDb(url, dataDir))
  try {
    return await read(store, query)
  } finally {
    await store.close()
  }
}

async function fromAdmin(adminUrl: string, params: URLSearchParams, token: string | undefined): Promise<Response> {
  const res = await fetch(new URL(`/audit?${params}`, adminUrl), { headers: token ? { authorization: `Bearer ${token}` } : {} })
  if (!res.ok) {
    const body = await res.json().catch(() => ({})) as { detail?: string }
    throw new UsageError(body.detail ?? `the admin plane answered ${res.status}`)
  }
  return res
}

/**
 * Tails new rejections: polls the admin plane every --every (default 1s) for
 * rows whose numeric id is above the last one printed, oldest first, until
 * interrupted. Starts with the newest --limit rows (default 10).
 */
async function follow(flags: Flags, params: URLSearchParams, format: Format): Promise<number> {
  const every = parseDuration(stringFlag(flags, 'every') ?? '1s')
  if (every === undefined || every < 100) throw new UsageError('--every must be a duration of at least 100ms, such as 2s')
  if (params.has('cursor')) throw new UsageError('--follow starts from the newest rows; it takes no --cursor')
  const initial = Number(params.get('limit') ?? '10')
  params.delete('limit')
  const write = (items: AuditItem[]) => {
    if (format === 'table') for (const i of items) console.log(tableLine(i))
    else if (format === 'json') for (const i of items) console.log(JSON.stringify(i))
    else if (items.length > 0) process.stdout.write(auditLines(format, items))
  }
  if (format === 'table') console.log(tableHeader)
  if (format === 'csv') process.stdout.write(auditLines('csv', [], true))
  let last = await newerThan(flags, params, undefined, initial, write)
  let stopped = false
  const stop = () => (stopped = true)
  process.once('SIGINT', stop).once('SIGTERM', stop)
  while (!stopped) {
    await new Promise((resolve) => setTimeout(resolve, every))
    if (!stopped) last = await newerThan(flags, params, last, Number.POSITIVE_INFINITY, write)
  }
  return 0
}

/** Pages back from the newest row to `after` (or up to `max` rows), prints them oldest first, returns the newest id. */
async function newerThan(flags: Flags, params: URLSearchParams, after: string | undefined, max: number, write: (items: AuditItem[]) => void): Promise<string | undefined> {
  const found: AuditItem[] = []
  let cursor: string | undefined
  for (;;) {
    const q = new URLSearchParams(params)
    q.set('limit', String(Math.min(1000, max - found.length)))
    if (cursor) q.set('cursor', cursor)
    let page: AuditPage
    try {
      page = (await adminCall<AuditPage>(flags, `/audit?${q}`)).body
    } catch (err) {
      if (err instanceof AdminError) throw new UsageError(`${adminUrlOf(flags, process.env)}: ${err.message}`)
      throw err
    }
    const fresh = page.items.filter((i) => after === undefined || BigInt(i.id) > BigInt(after))
    found.push(...fresh)
    if (fresh.length < page.items.length || !page.next_cursor || found.length >= max) break
    cursor = page.next_cursor
  }
  write(found.reverse())
  return found.at(-1)?.id ?? after
}
