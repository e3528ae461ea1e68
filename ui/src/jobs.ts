import { api, explainError, qs } from './api.js'
import { entityHref, fill, h, notice, table } from './dom.js'
import type { Screen } from './screen.js'

export interface JobView {
  job_id: string; type: string; key: string; state: string; attempt: number; fence: string
  owner: string | null; remaining_lease_ms: number | null; cancel_requested: boolean; error_code?: string | null
}
const states = ['queued', 'running', 'succeeded', 'failed', 'cancelled']
const pageSize = 50

/** "12 s", "3 min 05 s": what is left of a lease, to the second. */
export function leaseLeft(ms: number): string {
  if (ms <= 0) return 'expired'
  const s = Math.ceil(ms / 1000)
  return s < 60 ? `${s} s` : `${Math.floor(s / 60)} min ${String(s % 60).padStart(2, '0')} s`
}

export const renderJobs: Screen = (main, _path, params) => {
  const state = params.get('state') ?? ''
  const type = params.get('type') ?? ''
  const cursors: (string | undefined)[] = [undefined]
  const form = h('form', { class: 'filters', 'aria-label': 'Filters' },
    h('label', {}, 'State', h('select', { name: 'state' }, h('option', { value: '' }, 'any'), states.map((s) => h('option', { value: s, selected: s === state }, s)))),
    h('label', {}, 'Type', h('input', { name: 'type', value: type, placeholder: 'send-invoice', spellcheck: 'false' })),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary' }, 'Apply')))
  form.addEventListener('submit', (e) => {
    e.preventDefault()
    const d = new FormData(form)
    location.hash = `#/jobs${qs({ state: String(d.get('state') ?? ''), type: String(d.get('type') ?? '').trim() })}`
  })
  const tableBox = h('div', { id: 'jobs-table' })
  const pager = h('div', { class: 'pager' })
  fill(main, h('h1', {}, 'Jobs'),
    h('p', { class: 'lead' }, 'Jobs of the lease service. A running job has one holder at a time; its fence goes up by one with every new holder, so a worker whose lease ran out is refused (stale_fence or lease_expired) as soon as someone else claims the job. The countdown is what is left of the holder\'s lease: at zero, another worker may take it over.'),
    form, tableBox, pager)

  // Counts down from what the database said, on this page's monotonic clock.
  const countdown = window.setInterval(() => {
    for (const cell of tableBox.querySelectorAll<HTMLElement>('[data-deadline]')) cell.textContent = leaseLeft(Number(cell.dataset.deadline) - performance.now())
  }, 1000)

  const load = async (index: number) => {
    try {
      const page = await api<{ items: JobView[]; next_cursor: string | null }>(`/jobs${qs({ state, type, limit: pageSize, before: cursors[index] })}`)
      cursors.length = index + 1
      cursors.push(page.next_cursor ?? undefined)
      const read = performance.now()
      const rows = page.items.map((j) => h('tr', { 'data-job': j.job_id },
        h('td', { class: 'mono' }, j.job_id), h('td', {}, j.type), h('td', { class: 'mono' }, j.key),
        h('td', {}, h('span', { class: `state state-${j.state}` }, j.state), j.cancel_requested ? ' (cancel requested)' : '', j.error_code ? ` (${j.error_code})` : ''),
        h('td', {}, j.owner ?? '—'), h('td', { class: 'num' }, j.fence), h('td', { class: 'num' }, j.attempt),
        j.remaining_lease_ms === null ? h('td', {}, '—') : h('td', { class: 'num', 'data-deadline': read + j.remaining_lease_ms }, leaseLeft(j.remaining_lease_ms)),
        h('td', {}, h('a', { href: entityHref(`job:${j.job_id}`) }, 'fence history'))))
      fill(tableBox, summary(page.items), table(['Job', 'Type', 'Key', 'State', 'Holder', 'Fence', 'Attempt', 'Lease left', 'History'], rows, 'Jobs, newest first', 'No jobs match.'))
      fill(pager,
        h('button', { type: 'button', disabled: index === 0, onclick: () => void load(index - 1) }, '← Newer'),
        h('span', {}, `Page ${index + 1}`),
        h('button', { type: 'button', disabled: !page.next_cursor, onclick: () => void load(index + 1) }, 'Older →'))
    } catch (err) {
      fill(tableBox, notice('error', explainError(err, 'the jobs')))
    }
  }
  void load(0)
  return () => window.clearInterval(countdown)
}

function summary(items: JobView[]): HTMLElement {
  const counts = new Map<string, number>()
  for (const j of items) counts.set(`${j.state} ${j.type}`, (counts.get(`${j.state} ${j.type}`) ?? 0) + 1)
  return h('p', { class: 'hint' }, counts.size === 0 ? '' : `On this page: ${[...counts].map(([k, n]) => `${n} ${k}`).join(', ')}.`)
}
