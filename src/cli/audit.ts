import { parseAuditQuery, readAuditPage, type AuditPage } from '../admin.js'
import { openDb } from '../node.js'
import { FencegateError } from '../problems.js'
import { createStore } from '../store/store.js'
import { stringFlag, storeLocation, UsageError, type Flags } from './usage.js'

const filters = ['tenant', 'entity', 'code', 'route', 'since', 'until', 'limit', 'cursor'] as const

/**
 * `fencegate audit`: reads the audit trail from the database, or from a running
 * gateway's admin plane with --admin-url (the embedded store admits one process).
 */
export async function runAudit(flags: Flags): Promise<number> {
  const params = new URLSearchParams()
  for (const f of filters) {
    const v = stringFlag(flags, f)
    if (v !== undefined) params.set(f, v)
  }
  const adminUrl = stringFlag(flags, 'admin-url')
  const page = adminUrl ? await fromAdmin(adminUrl, params, stringFlag(flags, 'token') ?? process.env.FENCEGATE_TOKEN) : await fromDatabase(flags, params)
  if (flags.json) {
    console.log(JSON.stringify(page, null, 2))
    return 0
  }
  console.log(['at', 'code', 'route', 'entity', 'presented', 'highest', 'request'].join('\t'))
  for (const i of page.items) {
    console.log([i.at, i.code, i.route ?? '-', i.entity ?? '-', i.presented_fence ?? '-', i.highest_fence ?? '-', `${i.method} ${i.path} ${i.request_id}`].join('\t'))
  }
  if (page.next_cursor) console.log(`more: --cursor ${page.next_cursor}`)
  return 0
}

async function fromDatabase(flags: Flags, params: URLSearchParams): Promise<AuditPage> {
  let query
  try {
    query = parseAuditQuery(params)
  } catch (err) {
    if (err instanceof FencegateError) throw new UsageError(err.detail.replace(/^(\w+)/, '--$1'))
    throw err
  }
  const { url, dataDir } = storeLocation(flags, process.env)
  const store = createStore(await openDb(url, dataDir))
  try {
    return await readAuditPage(store, query)
  } finally {
    await store.close()
  }
}

async function fromAdmin(adminUrl: string, params: URLSearchParams, token: string | undefined): Promise<AuditPage> {
  const res = await fetch(new URL(`/audit?${params}`, adminUrl), { headers: token ? { authorization: `Bearer ${token}` } : {} })
  const body = (await res.json()) as AuditPage & { detail?: string }
  if (!res.ok) throw new UsageError(body.detail ?? `the admin plane answered ${res.status}`)
  return body
}
