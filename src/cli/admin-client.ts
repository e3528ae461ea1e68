import { stringFlag, UsageError, type Flags } from './usage.js'

/** The admin plane the operator commands talk to: --admin-url, else FENCEGATE_ADMIN_URL, else the default port on loopback. */
export function adminUrlOf(flags: Flags, env: NodeJS.ProcessEnv): string {
  const url = stringFlag(flags, 'admin-url') ?? env.FENCEGATE_ADMIN_URL ?? 'http://127.0.0.1:8081'
  try {
    return new URL(url).toString()
  } catch {
    throw new UsageError(`--admin-url must be a URL, got ${JSON.stringify(url)}`)
  }
}

/** A problem the admin plane answered with: printed as its detail, exit code 1. */
export class AdminError extends Error {
  override name = 'AdminError'
  constructor(readonly status: number, readonly code: string | undefined, detail: string, readonly problems: string[] = []) {
    super(detail)
  }
}

/**
 * Calls the admin plane with the operator's bearer token (--token, else
 * FENCEGATE_TOKEN) and returns the JSON body, or throws an AdminError.
 */
export async function adminCall<T>(flags: Flags, path: string, init: { method?: string; body?: unknown; headers?: Record<string, string> } = {}): Promise<{ body: T; headers: Headers }> {
  const token = stringFlag(flags, 'token') ?? process.env.FENCEGATE_TOKEN
  const headers: Record<string, string> = { ...init.headers }
  if (token) headers.authorization = `Bearer ${token}`
  if (init.body !== undefined) headers['content-type'] = 'application/json'
  let res: Response
  try {
    res = await fetch(new URL(path, adminUrlOf(flags, process.env)), {
      method: init.method ?? 'GET', headers, ...(init.body === undefined ? {} : { body: JSON.stringify(init.body) }),
    })
  } catch {
    throw new AdminError(0, undefined, `cannot reach the admin plane at ${adminUrlOf(flags, process.env)}`)
  }
  const body = await res.json().catch(() => undefined) as (T & { code?: string; detail?: string; problems?: string[] }) | undefined
  if (!res.ok || body === undefined) throw new AdminError(res.status, body?.code, body?.detail ?? `the admin plane answered ${res.status}`, body?.problems ?? [])
  return { body, headers: res.headers }
}
