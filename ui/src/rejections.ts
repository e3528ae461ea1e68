import { api, explainError, qs } from './api.js'
import { rejectionsChart } from './chart.js'
import { entityHref, fill, h, notice, table, when } from './dom.js'
import { explain, knownCodes } from './explain.js'
import type { Screen } from './screen.js'

export interface AuditItem {
  id: string; at: string; tenant: string; route: string | null; entity: string | null; code: string
  presented_fence: string | null; highest_fence: string | null; method: string; path: string
  caller: string | null; request_id: string
  /** The trace of the request that caused the row (32 hex digits); null when it was not traced. */
  trace_id: string | null
}
interface AuditPage { items: AuditItem[]; next_cursor: string | null }
interface Summary { bucket_ms: number; buckets: { at: string; code: string; count: number }[] }

const ranges: [string, string, number][] = [['15m', 'last 15 minutes', 15_000], ['1h', 'last hour', 60_000], ['6h', 'last 6 hours', 300_000], ['24h', 'last 24 hours', 900_000], ['7d', 'last 7 days', 3_600_000]]
const filterNames = ['code', 'route', 'entity', 'tenant', 'caller', 'trace_id'] as const
const pageSize = 25
/** How often the first page and the chart are read again while "Live" is on. */
export const pollMs = 3000

export const renderRejections: Screen = (main, _path, params) => {
  const range = ranges.find((r) => r[0] === params.get('since')) ?? ranges[1]!
  const filters = Object.fromEntries(filterNames.map((n) => [n, params.get(n) ?? ''])) as Record<(typeof filterNames)[number], string>
  const cursors: (string | undefined)[] = [undefined]
  let newestId: bigint | undefined
  let timer: number | undefined
  let stopped = false

  const form = filterForm(filters, range[0])
  const chartBox = h('div', { class: 'chart', id: 'rejections-chart', role: 'img', 'aria-label': 'Rejections over time by code' })
  const summaryBox = h('div', { id: 'rejections-summary' })
  const tableBox = h('div', { id: 'rejections-table', 'aria-live': 'polite' })
  const pager = h('div', { class: 'pager' })
  const live = h('input', { type: 'checkbox', id: 'live', checked: true })
  fill(main,
    h('h1', {}, 'Rejected commands'),
    h('p', { class: 'lead' }, 'Every command the gateway refused, newest first. A refusal means the command never reached the upstream: ',
      h('strong', {}, 'a stale fence'), ' is a worker that lost its lease and kept writing. Pick a row\'s entity to see who holds it now and to cut an old holder off.'),
    form,
    h('section', { 'aria-labelledby': 'chart-title' }, h('h2', { id: 'chart-title' }, `Rejections per code, ${range[1]}`), chartBox, summaryBox),
    h('section', { 'aria-labelledby': 'table-title' },
      h('div', { class: 'row' }, h('h2', { id: 'table-title' }, 'Rejections'), h('label', { class: 'inline' }, live, ' Live (new rows every few seconds)')),
      tableBox, pager))

  const query = (extra: Record<string, string | number | undefined>) => qs({ ...filters, since: range[0], ...extra })

  async function loadChart(): Promise<void> {
    try {
      const s = await api<Summary>(`/audit/summary${query({ bucket_ms: range[2] })}`)
      drawChart(chartBox, summaryBox, s, range[2], parseRange(range[0]))
    } catch (err) {
      fill(chartBox, notice('warn', explainError(err, 'the rejections chart')))
    }
  }

  async function loadPage(index: number): Promise<void> {
    try {
      const page = await api<AuditPage>(`/audit${query({ limit: pageSize, cursor: cursors[index] })}`)
      if (index === 0 && page.items[0]) newestId = BigInt(page.items[0].id)
      cursors.length = index + 1
      cursors.push(page.next_cursor ?? undefined)
      fill(tableBox, auditTable(page.items, new Set()))
      fill(pager,
        h('button', { type: 'button', disabled: index === 0, onclick: () => void loadPage(0) }, 'Newest'),
        h('button', { type: 'button', disabled: index === 0, onclick: () => void loadPage(index - 1) }, '← Newer'),
        h('span', {}, `Page ${index + 1}`),
        h('button', { type: 'button', id: 'older', disabled: !page.next_cursor, onclick: () => void loadPage(index + 1) }, 'Older →'))
      live.checked = index === 0 && live.checked
    } catch (err) {
      fill(tableBox, notice('error', explainError(err, 'the audit trail')))
    }
  }

  // Live: while on the first page, read it again and mark the rows that are new.
  async function poll(): Promise<void> {
    if (stopped) return
    if (live.checked && cursors.length <= 2) {
      try {
        const page = await api<AuditPage>(`/audit${query({ limit: pageSize })}`)
        const fresh = new Set(page.items.filter((i) => newestId === undefined || BigInt(i.id) > newestId).map((i) => i.id))
        if (fresh.size > 0 || newestId === undefined) {
          if (page.items[0]) newestId = BigInt(page.items[0].id)
          cursors.length = 1
          cursors.push(page.next_cursor ?? undefined)
          fill(tableBox, auditTable(page.items, fresh))
          await loadChart()
        }
      } catch {
        // The next round tries again; the table keeps what it showed.
      }
    }
    if (!stopped) timer = window.setTimeout(() => void poll(), pollMs)
  }

  void loadChart()
  void loadPage(0).then(() => { timer = window.setTimeout(() => void poll(), pollMs) })
  return () => {
    stopped = true
    window.clearTimeout(timer)
  }
}

function filterForm(filters: Record<string, string>, since: string): HTMLFormElement {
  const input = (name: string, label: string, hint: string, list?: string) => h('label', {}, label,
    h('input', { name, value: filters[name] ?? '', placeholder: hint, list, autocomplete: 'off', spellcheck: 'false' }))
  const form = h('form', { class: 'filters', 'aria-label': 'Filters' },
    input('code', 'Code', 'stale_fence', 'codes'),
    h('datalist', { id: 'codes' }, knownCodes.map((c) => h('option', { value: c }))),
    input('route', 'Route', 'capture-payment'),
    input('entity', 'Entity', 'invoice:42'),
    input('tenant', 'Tenant', 'every tenant'),
    input('caller', 'Caller', 'worker-7'),
    input('trace_id', 'Trace id', '32 hex digits'),
    h('label', {}, 'Time range', h('select', { name: 'since' }, ranges.map(([v, text]) => h('option', { value: v, selected: v === since }, text)))),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary' }, 'Apply'), h('a', { href: '#/rejections', class: 'button' }, 'Clear')))
  form.addEventListener('submit', (e) => {
    e.preventDefault()
    const data = new FormData(form)
    const q = new URLSearchParams()
    for (const [k, v] of data) if (typeof v === 'string' && v.trim()) q.set(k, v.trim())
    location.hash = `#/rejections?${q.toString()}`
  })
  return form
}

export function auditTable(items: AuditItem[], fresh: Set<string>): HTMLElement {
  const rows = items.map((i) => h('tr', { class: fresh.has(i.id) ? 'new' : undefined, 'data-id': i.id },
    h('td', {}, h('time', { datetime: i.at }, when(i.at))),
    h('td', {}, h('span', { class: `code code-${i.code}`, title: explain(i.code).meaning }, i.code)),
    h('td', {}, i.route ?? '—'),
    h('td', {}, i.entity ? h('a', { href: entityHref(i.entity, i.tenant) }, i.entity) : '—'),
    h('td', { class: 'num' }, i.presented_fence ?? '—'),
    h('td', { class: 'num' }, i.highest_fence ?? '—'),
    h('td', {}, i.caller ?? '—'),
    h('td', {}, i.tenant),
    h('td', { class: 'mono' }, `${i.method} ${i.path}`, h('br'), h('small', {}, i.request_id)),
    i.trace_id ? traceCell(i.trace_id) : h('td', {}, '—')))
  return table(['When', 'Code', 'Route', 'Entity', 'Presented', 'Highest', 'Caller', 'Tenant', 'Request', 'Trace'], rows, 'Rejected commands, newest first', 'No rejections match these filters in this time range. That is good news: every command was accepted.')
}

/**
 * A row's trace id, to look the request up in the tracing backend: selectable text (one click
 * selects all of it), a Copy button, and a link to the rows of that trace alone.
 */
function traceCell(traceId: string): HTMLTableCellElement {
  const text = h('code', { class: 'trace-id' }, traceId)
  const copy = h('button', { type: 'button', class: 'copy', 'aria-label': `Copy trace id ${traceId}` }, 'Copy')
  copy.addEventListener('click', () => void copyTraceId(traceId, text, copy))
  return h('td', { class: 'trace' }, text, h('br'), copy, ' ', h('a', { href: `#/rejections?trace_id=${traceId}`, title: 'Only the rows of this trace' }, 'this trace only'))
}

async function copyTraceId(traceId: string, text: HTMLElement, button: HTMLButtonElement): Promise<void> {
  try {
    await navigator.clipboard.writeText(traceId)
    button.textContent = 'Copied'
  } catch {
    // No clipboard (a page served over plain HTTP from another host is no secure context): select it for Ctrl+C.
    getSelection()?.selectAllChildren(text)
    button.textContent = 'Selected: press Ctrl+C'
  }
}

function parseRange(since: string): number {
  const n = Number(since.slice(0, -1))
  return n * ({ m: 60_000, h: 3_600_000, d: 86_400_000 } as Record<string, number>)[since.slice(-1)]!
}

function drawChart(box: HTMLElement, summaryBox: HTMLElement, s: Summary, bucketMs: number, rangeMs: number): void {
  const step = s.bucket_ms || bucketMs
  const end = Math.floor(Date.now() / step) * step
  const times: number[] = []
  for (let t = end - Math.ceil(rangeMs / step) * step; t <= end; t += step) times.push(t)
  const index = new Map(times.map((t, i) => [t, i]))
  const counts = new Map<string, number[]>()
  const totals = new Map<string, number>()
  for (const b of s.buckets) {
    const t = Math.floor(Date.parse(b.at) / step) * step
    if (!index.has(t)) { index.set(t, times.length); times.push(t) }
    if (!counts.has(b.code)) counts.set(b.code, [])
    counts.get(b.code)![index.get(t)!] = (counts.get(b.code)![index.get(t)!] ?? 0) + Number(b.count)
    totals.set(b.code, (totals.get(b.code) ?? 0) + Number(b.count))
  }
  const order = times.map((t, i) => [t, i] as const).sort((a, b) => a[0] - b[0])
  const series = new Map([...counts].map(([code, arr]) => [code, order.map(([, i]) => arr[i] ?? 0)]))
  box.replaceChildren()
  if (counts.size === 0) box.append(notice('info', 'No rejections in this time range.'))
  else rejectionsChart(box, order.map(([t]) => t / 1000), series, step / 1000)
  const total = [...totals.values()].reduce((a, b) => a + b, 0)
  box.dataset.total = String(total)
  const rows = [...totals].sort((a, b) => b[1] - a[1]).map(([code, n]) => h('tr', { 'data-code': code },
    h('th', { scope: 'row' }, h('span', { class: `code code-${code}` }, code)), h('td', { class: 'num' }, n),
    h('td', {}, explain(code).meaning, ' ', h('em', {}, explain(code).todo))))
  fill(summaryBox, rows.length ? table(['Code', 'Count', 'What it means and what to do'], rows, 'Rejections per code in this time range', '') : null)
}
