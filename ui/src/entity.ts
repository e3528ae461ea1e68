import { api, ApiError, canAdmin, explainError, qs } from './api.js'
import { fenceChart } from './chart.js'
import { confirmAction } from './confirm.js'
import { fill, h, notice, table, when } from './dom.js'
import type { Screen } from './screen.js'
import { auditTable, type AuditItem } from './rejections.js'
import { freezeActions } from './freeze.js'

interface EntityState { tenant: string; entity: string; highest_fence: string; updated_at: string; request_id: string }
export interface HistoryItem {
  id: string; at: string; tenant: string; entity: string; old_fence: string | null; new_fence: string
  source: 'command' | 'bump'; route: string | null; caller: string | null; request_id: string
}
interface KeyRecord { key: string; state: string; [field: string]: unknown }

export const renderEntity: Screen = (main, path, params) => {
  const entity = path[0]
  const tenant = params.get('tenant') ?? undefined
  const open = h('form', { class: 'filters', 'aria-label': 'Open an entity' },
    h('label', {}, 'Entity', h('input', { name: 'entity', value: entity ?? '', placeholder: 'invoice:42', required: true, spellcheck: 'false' })),
    h('label', {}, 'Tenant', h('input', { name: 'tenant', value: tenant ?? '', placeholder: 'default', spellcheck: 'false' })),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary' }, 'Open')))
  open.addEventListener('submit', (e) => {
    e.preventDefault()
    const d = new FormData(open)
    location.hash = `#/entity/${encodeURIComponent(String(d.get('entity')).trim())}${qs({ tenant: String(d.get('tenant') ?? '').trim() })}`
  })
  if (!entity) {
    fill(main, h('h1', {}, 'Entity'), h('p', { class: 'lead' }, 'An entity is what a fence protects: one invoice, one ticket, one job. Open one to see who holds it and who was refused.'), open)
    return () => {}
  }
  const nowBox = h('section', { id: 'entity-now', 'aria-labelledby': 'now-title' })
  const chartBox = h('div', { class: 'chart', id: 'entity-chart', role: 'img', 'aria-label': `Highest fence and refused fences of ${entity} over time` })
  const historyBox = h('div', { id: 'entity-history' })
  const rejectedBox = h('div', { id: 'entity-rejections' })
  const keysBox = h('div', { id: 'entity-keys' })
  const actionsBox = h('section', { id: 'entity-actions', 'aria-labelledby': 'actions-title' })
  fill(main, h('h1', {}, 'Entity ', h('code', {}, entity), tenant ? ` in tenant ${tenant}` : ''), open, nowBox,
    h('section', { 'aria-labelledby': 'timeline-title' }, h('h2', { id: 'timeline-title' }, 'Fence timeline'),
      h('p', { class: 'hint' }, 'Blue: the highest fence accepted, stepping up each time a new holder takes over or an operator bumps it. Red: fences presented by commands that were refused, on the same time axis.'),
      chartBox, h('h3', {}, 'Who raised the fence'), historyBox),
    h('section', { 'aria-labelledby': 'rej-title' }, h('h2', { id: 'rej-title' }, 'Refused commands for this entity'), rejectedBox),
    actionsBox,
    h('section', { 'aria-labelledby': 'keys-title' }, h('h2', { id: 'keys-title' }, 'Recent idempotency keys'), keysBox))

  const t = qs({ tenant })
  const load = async () => {
    const [state, history, audit] = await Promise.all([
      api<EntityState>(`/entities/${encodeURIComponent(entity)}${t}`).catch((err: unknown) => err),
      api<{ items: HistoryItem[] }>(`/entities/${encodeURIComponent(entity)}/history${qs({ tenant, limit: 200 })}`).catch((err: unknown) => err),
      api<{ items: AuditItem[] }>(`/audit${qs({ entity, tenant, limit: 200 })}`).catch((err: unknown) => err),
    ])
    showNow(nowBox, entity, state)
    const hist = history instanceof Error ? [] : (history as { items: HistoryItem[] }).items
    const rej = audit instanceof Error ? [] : (audit as { items: AuditItem[] }).items.filter((i) => i.code !== 'fence_bumped')
    fill(historyBox, history instanceof Error ? notice('warn', explainError(history, 'the fence history')) : historyTable(hist))
    fill(rejectedBox, audit instanceof Error ? notice('warn', explainError(audit, 'the refused commands')) : auditTable(rej, new Set()))
    chartBox.replaceChildren()
    const points = (xs: { at: string; fence: string | null }[]) => xs.filter((x) => x.fence !== null).map((x) => ({ t: Date.parse(x.at) / 1000, fence: Number(x.fence) }))
    if (hist.length + rej.length > 0) fenceChart(chartBox, points(hist.map((i) => ({ at: i.at, fence: i.new_fence }))), points(rej.map((i) => ({ at: i.at, fence: i.presented_fence }))))
    else chartBox.append(notice('info', 'Nothing recorded for this entity yet.'))
    const highest = state instanceof Error ? null : (state as EntityState).highest_fence
    showActions(actionsBox, entity, tenant, highest, load)
    void showKeys(keysBox, entity, tenant)
  }
  void load()
  return () => {}
}

function showNow(box: HTMLElement, entity: string, state: unknown): void {
  if (state instanceof ApiError && state.code === 'not_found') {
    fill(box, h('h2', { id: 'now-title' }, 'Now'), notice('info', `No fence has been accepted for ${entity} yet: the first command with any fence will be accepted.`))
  } else if (state instanceof Error) {
    fill(box, h('h2', { id: 'now-title' }, 'Now'), notice('error', explainError(state, 'the entity')))
  } else {
    const s = state as EntityState
    fill(box, h('h2', { id: 'now-title' }, 'Now'),
      h('dl', { class: 'facts' },
        h('dt', {}, 'Highest fence'), h('dd', { id: 'highest-fence', class: 'big' }, s.highest_fence),
        h('dt', {}, 'Since'), h('dd', {}, when(s.updated_at)),
        h('dt', {}, 'Last request at that fence'), h('dd', { class: 'mono' }, s.request_id)),
      h('p', { class: 'hint' }, `A command for ${entity} is accepted only with a fence of ${s.highest_fence} or more. A worker presenting less has lost its lease: it is refused with stale_fence, and nothing reaches the upstream.`))
  }
}

function historyTable(items: HistoryItem[]): HTMLElement {
  const rows = items.map((i) => h('tr', { 'data-id': i.id },
    h('td', {}, h('time', { datetime: i.at }, when(i.at))),
    h('td', { class: 'num' }, i.old_fence ?? 'none', ' → ', h('strong', {}, i.new_fence)),
    h('td', {}, i.source === 'bump' ? h('span', { class: 'tag bump' }, 'operator bump') : 'command'),
    h('td', {}, i.route ?? '—'),
    h('td', {}, i.caller ?? '—'),
    h('td', { class: 'mono' }, i.request_id)))
  return table(['When', 'Fence', 'How', 'Route', 'Caller', 'Request'], rows, 'Changes of the highest fence, newest first', 'No change of fence recorded.')
}

function showActions(box: HTMLElement, entity: string, tenant: string | undefined, highest: string | null, reload: () => Promise<void>): void {
  if (!canAdmin()) {
    fill(box, h('h2', { id: 'actions-title' }, 'Actions'), notice('info', 'Bumping and freezing need a token with the fencegate:admin scope.'))
    return
  }
  const next = highest === null ? '1' : (BigInt(highest) + 1n).toString()
  const input = h('input', { id: 'bump-fence', name: 'min_fence', value: next, inputmode: 'numeric', pattern: '[0-9]{1,19}', required: true })
  const result = h('div', { 'aria-live': 'polite' })
  const form = h('form', { class: 'inline-form', 'aria-label': 'Bump the fence' },
    h('label', {}, 'New lowest fence', input),
    h('button', { type: 'submit', class: 'danger', id: 'bump' }, 'Bump fence…'))
  form.addEventListener('submit', (e) => {
    e.preventDefault()
    void (async () => {
      const min = input.value.trim()
      const ok = await confirmAction(`Bump the fence of ${entity}?`, [
        h('p', {}, `From now on every command for ${entity} with a fence below ${min} is refused (stale_fence). `,
          'Use it when a worker that lost its lease keeps writing, or when you no longer trust any current holder.'),
        h('p', {}, `The next worker must hold fence ${min} or higher: make sure your lease service hands out fences of ${min} or more from now on. The bump is audited with your name.`),
      ], `Bump to ${min}`)
      if (!ok) return
      try {
        const r = await api<{ previous_fence: string | null; highest_fence: string; raised: boolean }>(`/entities/${encodeURIComponent(entity)}/bump${qs({ tenant })}`, { method: 'POST', body: JSON.stringify({ min_fence: min }) })
        fill(result, notice('info', r.raised ? `Raised from ${r.previous_fence ?? 'none'} to ${r.highest_fence}. Holders of a lower fence are cut off.` : `Not raised: the highest fence is already ${r.highest_fence}.`))
        await reload()
      } catch (err) {
        fill(result, notice('error', explainError(err, 'the bump')))
      }
    })()
  })
  fill(box, h('h2', { id: 'actions-title' }, 'Actions'),
    h('h3', {}, 'Cut off old holders'), h('p', { class: 'hint' }, 'A bump raises the lowest acceptable fence without waiting for a new holder. It never lowers a fence.'), form, result,
    freezeActions(entity, tenant, confirmAction))
}

async function showKeys(box: HTMLElement, entity: string, tenant: string | undefined): Promise<void> {
  try {
    const page = await api<{ items: KeyRecord[] }>(`/entities/${encodeURIComponent(entity)}/keys${qs({ tenant })}`)
    const rows = page.items.map((k) => h('tr', {},
      h('td', { class: 'mono' }, k.key), h('td', {}, k.state),
      h('td', { class: 'num' }, String(k.fence ?? '—')),
      h('td', {}, typeof k.created_at === 'string' ? when(k.created_at) : '—'),
      h('td', { class: 'num' }, String(k.response_status ?? k.status ?? '—'))))
    fill(box, h('p', { class: 'hint' }, 'A key names one operation; a duplicate with the same key gets the stored answer instead of a second call. "unknown" means the upstream\'s answer was lost: release the key only once you know the operation did not happen.'),
      table(['Key', 'State', 'Fence', 'Created', 'Status'], rows, 'Recent idempotency keys', 'No idempotency keys recorded for this entity.'))
  } catch (err) {
    fill(box, notice('info', err instanceof ApiError && err.code === 'not_found' ? 'This gateway does not list keys by entity.' : explainError(err, 'the keys')))
  }
}
