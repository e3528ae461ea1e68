import { api, ApiError, explainError } from './api.js'
import { fill, h, notice } from './dom.js'

interface Rule { name: string; entity_match?: string; frozen?: boolean; tenant?: string; [field: string]: unknown }

/** `*` stands for any run of characters, everything else is literal (as docs/rules.md says). */
export function matches(pattern: string, entity: string): boolean {
  const re = new RegExp(`^${pattern.split('*').map((p) => p.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('[\\s\\S]*')}$`)
  return re.test(entity)
}

/** The rule the console writes to freeze one entity: a readable name from the entity, within 64 characters. */
export function freezeRuleName(entity: string, tenant: string | undefined): string {
  const slug = `${tenant && tenant !== 'default' ? `${tenant}-` : ''}${entity}`.replace(/[^A-Za-z0-9_.-]+/g, '-').replace(/^[^A-Za-z0-9]+/, '')
  return `freeze-${slug}`.slice(0, 64)
}

type Confirm = (title: string, body: (Node | string)[], action: string) => Promise<boolean>

/** Freeze and unfreeze through entity rules: a freeze refuses every command (423 entity_frozen) until it is lifted. */
export function freezeActions(entity: string, tenant: string | undefined, confirm: Confirm): HTMLElement {
  const box = h('div', { id: 'freeze' })
  const load = async () => {
    let rules: Rule[]
    try {
      rules = (await api<{ rules: Rule[] }>('/rules')).rules
    } catch (err) {
      fill(box, h('h3', {}, 'Freeze'), notice('info', err instanceof ApiError && err.code === 'not_found' ? 'This gateway keeps no rules in its database, so it cannot freeze from here.' : explainError(err, 'the rules')))
      return
    }
    const freezing = rules.filter((r) => r.frozen === true && typeof r.entity_match === 'string' && matches(r.entity_match, entity) && (r.tenant === undefined || r.tenant === (tenant ?? 'default')))
    const status = h('div', { 'aria-live': 'polite' })
    const act = async (what: 'freeze' | 'unfreeze') => {
      const ok = what === 'freeze'
        ? await confirm(`Freeze ${entity}?`, [h('p', {}, `Every command for ${entity} will be refused with 423 entity_frozen, whatever its fence or key, until you unfreeze it. Nothing reaches the upstream meanwhile.`), h('p', {}, 'Use it to stop all writes while you find out what happened.')], 'Freeze')
        : await confirm(`Unfreeze ${entity}?`, [h('p', {}, `Commands for ${entity} will be judged by their fence again. These rules will be deleted: ${freezing.map((r) => r.name).join(', ')}.`)], 'Unfreeze')
      if (!ok) return
      try {
        if (what === 'freeze') {
          const rule: Rule = { name: freezeRuleName(entity, tenant), entity_match: entity, frozen: true, ...(tenant ? { tenant } : {}) }
          await api(`/rules/${encodeURIComponent(rule.name)}`, { method: 'PUT', body: JSON.stringify(rule) })
        } else {
          for (const r of freezing) await api(`/rules/${encodeURIComponent(r.name)}`, { method: 'DELETE' })
        }
        await load()
      } catch (err) {
        fill(status, notice('error', explainError(err, `the ${what}`)))
      }
    }
    fill(box, h('h3', {}, 'Freeze'),
      freezing.length > 0
        ? notice('warn', `${entity} is frozen by ${freezing.map((r) => r.name).join(', ')}: every command to it is refused.`)
        : h('p', { class: 'hint' }, `${entity} is not frozen. A freeze refuses every command to it until lifted.`),
      entity.includes('*') ? notice('warn', 'This entity contains *, which a rule reads as a wildcard: freeze it with a rule of your own.') : null,
      freezing.length > 0
        ? h('button', { type: 'button', id: 'unfreeze', onclick: () => void act('unfreeze') }, 'Unfreeze…')
        : h('button', { type: 'button', id: 'freeze-button', class: 'danger', disabled: entity.includes('*'), onclick: () => void act('freeze') }, 'Freeze…'),
      status)
  }
  void load()
  return box
}
