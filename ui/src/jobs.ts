import { api, canAdmin, explainError, qs } from './api.js'
import { confirmAction } from './confirm.js'
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
  // Empty: the token's own tenant, as the gateway reads a request without ?tenant=.
  const tenant = params.get('tenant') ?? ''
  const cursors: (string | undefined)[] = [undefined]
  const form = h('form', { class: 'filters', 'aria-label': 'Filters' },
    h('label', {}, 'Tenant', h('input', { name: 'tenant', value: tenant, placeholder: 'the token\'s', spellcheck: 'false' })),
    h('label', {}, 'State', h('select', { name: 'state' }, h('option', { value: '' }, 'any'), states.map((s) => h('option', { value: s, selected: s === state }, s)))),
    h('label', {}, 'Type', h('input', { name: 'type', value: type, placeholder: 'send-invoice', spellcheck: 'false' })),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary' }, 'Apply')))
  form.addEventListener('submit', (e) => {
    e.preventDefault()
    const d = new FormData(form)
    location.hash = `#/jobs${qs({ tenant: String(d.get('tenant') ?? '').trim(), state: String(d.get('state') ?? ''), type: String(d.get('type') ?? '').trim() })}`
  })
  const result = h('div', { 'aria-live': 'polite', id: 'job-action-result' })
  const tableBox = h('div', { id: 'jobs-table' })
  const pager = h('div', { class: 'pager' })
  fill(main, h('h1', {}, 'Jobs'),
    h('p', { class: 'lead' }, 'Jobs of the lease service. A running job has one holder at a time; its fence goes up by one with every new holder, so a worker whose lease ran out is refused (stale_fence or lease_expired) as soon as someone else claims the job. The countdown is what is left of the holder\'s lease: at zero, another worker may take it over.'),
    form, result, tableBox, pager)

  // Counts down from what the database said, on this page's monotonic clock.
  const countdown = window.setInterval(() => {
    for (const cell of tableBox.querySelectorAll<HTMLElement>('[data-deadline]')) cell.textContent = leaseLeft(Number(cell.dataset.deadline) - performance.now())
  }, 1000)

  const load = async (index: number) => {
    try {
      const page = await api<{ items: JobView[]; next_cursor: string | null }>(`/jobs${qs({ tenant, state, type, limit: pageSize, before: cursors[index] })}`)
      cursors.length = index + 1
      cursors.push(page.next_cursor ?? undefined)
      const read = performance.now()
      const rows = page.items.map((j) => h('tr', { 'data-job': j.job_id },
        h('td', { class: 'mono' }, j.job_id), h('td', {}, j.type), h('td', { class: 'mono' }, j.key),
        h('td', {}, h('span', { class: `state state-${j.state}` }, j.state), j.cancel_requested ? ' (cancel requested)' : '', j.error_code ? ` (${j.error_code})` : ''),
        h('td', {}, j.owner ?? '—'), h('td', { class: 'num' }, j.fence), h('td', { class: 'num' }, j.attempt),
        j.remaining_lease_ms === null ? h('td', {}, '—') : h('td', { class: 'num', 'data-deadline': read + j.remaining_lease_ms }, leaseLeft(j.remaining_lease_ms)),
        h('td', {}, h('a', { href: entityHref(`job:${j.job_id}`, tenant) }, 'fence history')),
        h('td', { class: 'job-actions' }, actionsFor(j, tenant, result, () => load(index)))))
      fill(tableBox, summary(page.items), table(['Job', 'Type', 'Key', 'State', 'Holder', 'Fence', 'Attempt', 'Lease left', 'History', 'Actions'], rows, 'Jobs, newest first', 'No jobs match.'))
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

/** What each action does, in the words its confirmation uses. */
const actions = {
  cancel: {
    label: 'Cancel…', when: (j: JobView) => j.state === 'queued' || (j.state === 'running' && !j.cancel_requested),
    says: (j: JobView) => j.state === 'queued'
      ? 'The job is cancelled now and no worker will claim it.'
      : `The holder (${j.owner ?? 'none'}) is told at its next heartbeat and should stop; when it releases or fails, the job ends cancelled. Its writes through the gateway stay fenced until then.`,
  },
  release: {
    label: 'Release…', when: (j: JobView) => j.state === 'running',
    says: (j: JobView) => `The lease of ${j.owner ?? 'its holder'} ends now. The job is queued again; the next worker to claim it gets a fence above ${j.fence}, and ${j.owner ?? 'the old holder'} is refused from its next heartbeat, append or completion on (lease_lost). Use it for a holder that is stuck. The attempt is not counted.`,
  },
  retry: {
    label: 'Retry…', when: (j: JobView) => j.state === 'failed' || j.state === 'cancelled',
    says: () => 'The job is queued again as a new attempt cycle (attempt 0; its result, error and output are cleared). Its next holder gets a higher fence.',
  },
} as const

/** The row's action buttons, for an admin token; each asks first and says what will happen. */
function actionsFor(j: JobView, tenant: string, result: HTMLElement, reload: () => Promise<void>): HTMLElement[] {
  if (!canAdmin()) return []
  return (Object.entries(actions) as [keyof typeof actions, (typeof actions)[keyof typeof actions]][]).filter(([, a]) => a.when(j)).map(([name, a]) =>
    h('button', {
      type: 'button', class: name === 'retry' ? 'primary' : 'danger', 'data-action': name,
      onclick: () => void (async () => {
        const ok = await confirmAction(`${name[0]!.toUpperCase()}${name.slice(1)} job ${j.job_id}?`, [
          h('p', {}, a.says(j)), h('p', {}, 'The action is audited with your name.')], `${name[0]!.toUpperCase()}${name.slice(1)} job ${j.job_id}`)
        if (!ok) return
        try {
          const r = await api<{ state: string }>(`/jobs/${j.job_id}/${name}${qs({ tenant })}`, { method: 'POST' })
          fill(result, notice('info', `Job ${j.job_id}: ${name} done; it is ${r.state} now.`))
          await reload()
        } catch (err) {
          fill(result, notice('error', explainError(err, `the ${name}`)))
        }
      })(),
    }, a.label))
}

function summary(items: JobView[]): HTMLElement {
  const counts = new Map<string, number>()
  for (const j of items) counts.set(`${j.state} ${j.type}`, (counts.get(`${j.state} ${j.type}`) ?? 0) + 1)
  return h('p', { class: 'hint' }, counts.size === 0 ? '' : `On this page: ${[...counts].map(([k, n]) => `${n} ${k}`).join(', ')}.`)
}
