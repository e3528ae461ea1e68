// Every call to the admin plane goes through `api`: it adds the token (under auth.mode: jwt)
// and asks for one when the gateway answers 401.

const tokenKey = 'fencegate.token'
/** The admin plane's root: the console is served at <root>/ui/. */
const root = location.pathname.replace(/\/ui(\/.*)?$/, '')

/** A refusal from the admin plane, with its problem code. */
export class ApiError extends Error {
  constructor(readonly status: number, readonly code: string, detail: string) {
    super(detail)
  }
}

export const token = {
  get: (): string | null => sessionStorage.getItem(tokenKey),
  set: (value: string) => sessionStorage.setItem(tokenKey, value),
  clear: () => sessionStorage.removeItem(tokenKey),
}

/** The scopes the token claims (the gateway decides; this only hides buttons that would be refused). */
export function scopes(): Set<string> | null {
  const t = token.get()
  if (!t) return null
  try {
    const part = t.split('.')[1]!.replace(/-/g, '+').replace(/_/g, '/')
    const claims = JSON.parse(atob(part)) as { scope?: unknown; sub?: unknown }
    return new Set(typeof claims.scope === 'string' ? claims.scope.split(' ') : [])
  } catch {
    return new Set()
  }
}

export function canAdmin(): boolean {
  const s = scopes()
  return s === null || s.has('fencegate:admin')
}

let asking: Promise<void> | undefined

/** Shows the token prompt once, however many calls are waiting for it. */
function askForToken(reason: string): Promise<void> {
  asking ??= new Promise<void>((resolve) => {
    const dialog = document.getElementById('token-dialog') as HTMLDialogElement
    const input = document.getElementById('token-input') as HTMLInputElement
    const form = document.getElementById('token-form') as HTMLFormElement
    document.getElementById('token-error')!.textContent = reason
    input.value = ''
    const submit = (e: Event) => {
      e.preventDefault()
      if (!input.value.trim()) return
      token.set(input.value.trim())
      form.removeEventListener('submit', submit)
      dialog.close()
      asking = undefined
      document.dispatchEvent(new Event('fencegate:token'))
      resolve()
    }
    form.addEventListener('submit', submit)
    // Escape would leave the page without a token and every call waiting: keep it open.
    dialog.addEventListener('cancel', (e) => e.preventDefault())
    dialog.showModal()
    input.focus()
  })
  return asking
}

/**
 * Calls the admin plane and parses its JSON; a problem becomes an ApiError.
 *
 * @example
 * const page = await api<AuditPage>('/audit?limit=50')
 */
export async function api<T>(path: string, init: RequestInit = {}): Promise<T> {
  for (;;) {
    const headers = new Headers(init.headers)
    const t = token.get()
    if (t) headers.set('authorization', `Bearer ${t}`)
    if (init.body !== undefined) headers.set('content-type', 'application/json')
    const res = await fetch(root + path, { ...init, headers })
    const text = await res.text()
    let body: unknown
    try {
      body = text ? JSON.parse(text) : undefined
    } catch {
      body = undefined
    }
    if (res.status === 401) {
      const detail = (body as { detail?: string } | undefined)?.detail
      await askForToken(t ? `The gateway refused the token: ${detail ?? 'unauthenticated'}` : '')
      continue
    }
    if (!res.ok) {
      const p = (body ?? {}) as { code?: string; detail?: string; title?: string }
      throw new ApiError(res.status, p.code ?? 'error', p.detail ?? p.title ?? `${res.status} ${res.statusText}`)
    }
    return body as T
  }
}

/** A query string from the defined values. */
export function qs(params: Record<string, string | number | undefined | null>): string {
  const q = new URLSearchParams()
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, String(v))
  const s = q.toString()
  return s ? `?${s}` : ''
}

/** Explains a refusal in words: missing endpoints and missing scopes are common and not bugs. */
export function explainError(err: unknown, what: string): string {
  if (err instanceof ApiError) {
    if (err.code === 'insufficient_scope') return `Your token may not read ${what}: ${err.message}. Ask for a token with the fencegate:admin scope.`
    if (err.code === 'store_unavailable') return `The gateway could not reach its store to read ${what}. Check its database; commands fail closed meanwhile.`
    return `Could not read ${what}: ${err.message} (${err.code}).`
  }
  return `Could not reach the admin plane to read ${what}: ${String(err)}.`
}
