// A small element builder: properties and attributes, never a `style` attribute (the
// Content-Security-Policy refuses inline styles; classes carry every look).
type Child = Node | string | number | null | undefined | false
type Attrs = Record<string, string | number | boolean | EventListener | undefined | null>

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: (Child | Child[])[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag)
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue
    if (name.startsWith('on') && typeof value === 'function') el.addEventListener(name.slice(2), value)
    else if (name === 'class') el.className = String(value)
    else if (value === true) el.setAttribute(name, '')
    else el.setAttribute(name, String(value))
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue
    el.append(typeof child === 'object' ? child : String(child))
  }
  return el
}

/** Replaces an element's children. */
export function fill(el: Element, ...children: (Child | Child[])[]): void {
  el.replaceChildren()
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue
    el.append(typeof child === 'object' ? child : String(child))
  }
}

/** A time from the database clock, shown in the reader's zone with seconds. */
export function when(iso: string): string {
  const d = new Date(iso)
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString(undefined, { dateStyle: 'short', timeStyle: 'medium' })
}

/** The link to an entity's screen. */
export function entityHref(entity: string, tenant?: string | null): string {
  const q = tenant && tenant !== 'default' ? `?tenant=${encodeURIComponent(tenant)}` : ''
  return `#/entity/${encodeURIComponent(entity)}${q}`
}

export function table(head: string[], rows: HTMLTableRowElement[], caption: string, empty: string): HTMLElement {
  if (rows.length === 0) return h('p', { class: 'empty' }, empty)
  return h('div', { class: 'table-wrap' }, h('table', {},
    h('caption', { class: 'sr-only' }, caption),
    h('thead', {}, h('tr', {}, head.map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, rows)))
}

export function notice(kind: 'info' | 'error' | 'warn', ...children: Child[]): HTMLElement {
  return h('div', { class: `notice ${kind}`, role: kind === 'error' ? 'alert' : 'status' }, ...children)
}
