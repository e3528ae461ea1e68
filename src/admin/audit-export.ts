import { storeCall } from './query.js'
import type { AuditItem, AuditQuery, Store } from '../store/store.js'

/** How `GET /audit` answers: one JSON page, or every matching row as NDJSON or CSV. */
export type AuditFormat = 'json' | 'ndjson' | 'csv'

const contentTypes = { ndjson: 'application/x-ndjson', csv: 'text/csv; charset=utf-8' } as const
const columns = ['id', 'at', 'tenant', 'route', 'entity', 'code', 'presented_fence', 'highest_fence', 'method', 'path',
  'body_sha256', 'caller', 'request_id', 'idempotency_key', 'trace_id', 'trace_from_caller'] as const satisfies readonly (keyof AuditItem)[]

// Rows per store statement while streaming: small enough to start at once, large enough to cost few round trips.
const pageSize = 500

/** `?format=` wins; otherwise the first of NDJSON or CSV that Accept names, else JSON. */
export function auditFormat(format: AuditFormat | undefined, accept: string | undefined): AuditFormat {
  if (format) return format
  for (const part of (accept ?? '').split(',')) {
    const type = part.split(';')[0]!.trim().toLowerCase()
    if (type === 'application/x-ndjson') return 'ndjson'
    if (type === 'text/csv') return 'csv'
  }
  return 'json'
}

/**
 * Streams every row that matches `query`, newest first, page by page (keyset on
 * the numeric id, so rows written meanwhile neither repeat nor shift the pages).
 * `max` caps the rows when the caller gave a limit. The first page is read
 * before answering, so a store that is down is a 503 problem; a failure later
 * aborts the stream, and the client sees a truncated body rather than a short
 * export that looks complete.
 *
 * @example
 * return exportAudit(store, { code: 'stale_fence', limit: 100 }, 'csv', undefined)
 */
export async function exportAudit(store: Store, query: AuditQuery, format: 'ndjson' | 'csv', max: number | undefined): Promise<Response> {
  let remaining = max ?? Number.POSITIVE_INFINITY
  let before = query.before
  let done = false
  const encoder = new TextEncoder()
  const nextPage = async (): Promise<string> => {
    const limit = Math.min(pageSize, remaining)
    const rows = await store.listAudit({ ...query, before, limit })
    remaining -= rows.length
    done = rows.length < limit || remaining <= 0
    before = rows.at(-1)?.id
    return rows.map(format === 'csv' ? csvLine : (r) => `${JSON.stringify(r)}\n`).join('')
  }
  const first = (format === 'csv' ? csvHeader : '') + await storeCall(nextPage)
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      controller.enqueue(encoder.encode(first))
      if (done) controller.close()
    },
    async pull(controller) {
      try {
        controller.enqueue(encoder.encode(await nextPage()))
        if (done) controller.close()
      } catch (err) {
        controller.error(err)
      }
    },
  }, { highWaterMark: 0 })
  const headers: Record<string, string> = { 'content-type': contentTypes[format], 'cache-control': 'no-store' }
  if (format === 'csv') headers['content-disposition'] = 'attachment; filename="fencegate-audit.csv"'
  return new Response(body, { status: 200, headers })
}

const csvHeader = `${columns.join(',')}\r\n`

/** Rows as NDJSON or CSV text (with the CSV header line when `header`), as the export writes them. */
export function auditLines(format: 'ndjson' | 'csv', items: AuditItem[], header = false): string {
  return (header && format === 'csv' ? csvHeader : '') + items.map(format === 'csv' ? csvLine : (r) => `${JSON.stringify(r)}\n`).join('')
}

function csvLine(item: AuditItem): string {
  return `${columns.map((c) => csvCell(item[c])).join(',')}\r\n`
}

/**
 * RFC 4180 quoting. A cell that a spreadsheet would run as a formula (=, +, -, @,
 * tab, CR first) gets a leading apostrophe: paths and entities come from clients.
 */
export function csvCell(value: string | boolean | null): string {
  if (value === null) return ''
  if (typeof value === 'boolean') return String(value)
  const safe = /^[=+\-@\t\r]/.test(value) ? `'${value}` : value
  return /[",\r\n]/.test(safe) ? `"${safe.replaceAll('"', '""')}"` : safe
}
