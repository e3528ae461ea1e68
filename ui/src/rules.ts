import { api, explainError, qs } from './api.js'
import { fill, h, notice, table, when } from './dom.js'
import type { Screen } from './screen.js'

type Rule = Record<string, unknown> & { name: string }
interface RuleChange { version: number; name: string; kind: string; rule: Rule | null; changed_by: string | null; changed_at: string; source: string }

/** A rule as field paths (`match.body.x`) and JSON-written values, so any two versions compare field by field. */
export function flatten(value: unknown, prefix = '', out = new Map<string, string>()): Map<string, string> {
  if (value !== null && typeof value === 'object' && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value)) flatten(v, prefix ? `${prefix}.${k}` : k, out)
  } else if (prefix) {
    out.set(prefix, JSON.stringify(value))
  }
  return out
}

/** Field by field, old → new: added fields have no old value, removed ones no new value. */
export function diffRules(older: Rule | null, newer: Rule | null): { field: string; old: string | null; new: string | null }[] {
  const a = flatten(older ?? {})
  const b = flatten(newer ?? {})
  const fields = [...new Set([...a.keys(), ...b.keys()])].sort()
  return fields.filter((f) => a.get(f) !== b.get(f)).map((f) => ({ field: f, old: a.get(f) ?? null, new: b.get(f) ?? null }))
}

export const renderRules: Screen = (main, path, params) => {
  const listBox = h('div', { id: 'rules-list' })
  const detailBox = h('div', { id: 'rule-detail' })
  fill(main, h('h1', {}, 'Rules'),
    h('p', { class: 'lead' }, 'Routes and entity rules kept in the database: every gateway sharing it applies a change within a second. Each change is a new version with who made it; pick a rule to see its versions and what changed between two of them.'),
    listBox, detailBox)
  void (async () => {
    try {
      const set = await api<{ version: number; rules: Rule[] }>('/rules')
      const rows = set.rules.map((r) => h('tr', {},
        h('td', {}, h('a', { href: `#/rules/${encodeURIComponent(r.name)}` }, r.name)),
        h('td', {}, 'entity_match' in r ? `entity rule: ${String(r.entity_match)}` : `route: ${String(r.method ?? '')} ${String(r.path ?? '')}`),
        h('td', {}, 'entity_match' in r ? [r.frozen ? 'frozen' : '', r.fence ? `fence ${String(r.fence)}` : '', r.tenant ? `tenant ${String(r.tenant)}` : ''].filter(Boolean).join(', ') : `fence ${String(r.fence ?? '')}`)))
      fill(listBox, h('h2', {}, `Current rules (version ${set.version})`), table(['Name', 'What', 'Settings'], rows, 'Current rules', 'No rules in the database.'))
    } catch (err) {
      fill(listBox, notice('warn', explainError(err, 'the rules')))
    }
    if (path[0]) await showHistory(detailBox, path[0], params)
  })()
  return () => {}
}

async function showHistory(box: HTMLElement, name: string, params: URLSearchParams): Promise<void> {
  let items: RuleChange[]
  try {
    items = (await api<{ items: RuleChange[] }>(`/rules/${encodeURIComponent(name)}/history${qs({ limit: 100 })}`)).items
  } catch (err) {
    fill(box, notice('error', explainError(err, `the history of ${name}`)))
    return
  }
  const versions = items.map((i) => i.version)
  const to = Number(params.get('to') ?? versions[0])
  const from = Number(params.get('from') ?? versions[1] ?? versions[0])
  const pick = (n: string, selected: number) => h('select', { name: n, id: `diff-${n}` }, items.map((i) => h('option', { value: i.version, selected: i.version === selected }, `v${i.version} ${when(i.changed_at)}`)))
  const form = h('form', { class: 'filters', 'aria-label': 'Compare versions' },
    h('label', {}, 'Old version', pick('from', from)), h('label', {}, 'New version', pick('to', to)),
    h('div', { class: 'actions' }, h('button', { type: 'submit', class: 'primary' }, 'Compare')))
  form.addEventListener('submit', (e) => {
    e.preventDefault()
    const d = new FormData(form)
    location.hash = `#/rules/${encodeURIComponent(name)}${qs({ from: String(d.get('from')), to: String(d.get('to')) })}`
  })
  const older = items.find((i) => i.version === from)
  const newer = items.find((i) => i.version === to)
  const changes = older && newer ? diffRules(older.rule, newer.rule) : []
  const rows = changes.map((c) => h('tr', { class: c.old === null ? 'added' : c.new === null ? 'removed' : 'changed' },
    h('th', { scope: 'row', class: 'mono' }, c.field), h('td', { class: 'mono old' }, c.old ?? '(absent)'), h('td', {}, '→'), h('td', { class: 'mono new' }, c.new ?? '(absent)')))
  const historyRows = items.map((i) => h('tr', {},
    h('td', { class: 'num' }, `v${i.version}`), h('td', {}, when(i.changed_at)), h('td', {}, i.changed_by ?? '—'), h('td', {}, i.source),
    h('td', {}, i.rule === null ? 'deleted' : 'set')))
  fill(box, h('h2', {}, 'Rule ', h('code', {}, name)),
    h('h3', {}, 'Versions'), table(['Version', 'When', 'By', 'Source', 'Change'], historyRows, `Versions of ${name}, newest first`, 'No versions.'),
    h('h3', {}, `What changed from v${from} to v${to}`), form,
    h('div', { id: 'rule-diff' }, table(['Field', 'Old', '', 'New'], rows, `Fields changed from v${from} to v${to}`, from === to ? 'Pick two different versions.' : 'No field changed.')))
}
