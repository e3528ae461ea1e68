import postgres from 'postgres'
import { ConfigError } from '../config/schema.js'

/**
 * Finding the primary among the hosts of a libpq multi-host URL
 * (`postgres://u@h1:5432,h2:5433/db`).
 *
 * postgres.js takes such a URL, but its `target_session_attrs=read-write` check reads only
 * `default_transaction_read_only`, which a hot standby reports as `off`, so it lands on a
 * standby; and with several hosts it never fails a statement while no host qualifies, it
 * cycles through them for as long as the statement waits. So fencegate hands postgres.js one
 * host and picks that host itself: each new connection goes to the host last found to
 * qualify, and after a failure on it (`forget`) the hosts are asked again, all at once, each
 * within the connect timeout. None qualifying fails the connection at once, before anything
 * is sent: the command is refused with 503, never forwarded.
 */

/** libpq's `target_session_attrs` values a gateway can write through. */
export type SessionAttrs = 'read-write' | 'primary' | 'any'

export interface HostPort {
  host: string
  port: number
}

export interface StoreHosts {
  /** The hosts in the URL's order. */
  hosts: HostPort[]
  /** The URL naming only the first host, without `target_session_attrs`: what postgres.js is given. */
  url: string
  /** What a host must be to be used (libpq's meanings; `read-write` unless the URL says). */
  attrs: SessionAttrs
}

const writable: readonly string[] = ['read-write', 'primary', 'any']

/**
 * Reads the hosts of a store URL. A URL of one host (or a Unix socket) keeps its attrs `any`:
 * there is nothing to choose from. With several hosts the default is `read-write`: not in
 * recovery and not read-only by default, libpq's meaning, so that neither a hot standby nor an
 * old primary set read-only is written through.
 *
 * @example
 * readStoreHosts('postgres://fg@db1:5432,db2:5432/fencegate').attrs // 'read-write'
 */
export function readStoreHosts(url: string): StoreHosts {
  const match = /^(postgres(?:ql)?:\/\/(?:[^@/]*@)?)([^/?#]*)(.*)$/.exec(url)
  if (!match) return { hosts: [], url, attrs: 'any' }
  const [, head, hostList, rest] = match as unknown as [string, string, string, string]
  const query = rest.indexOf('?')
  const params = new URLSearchParams(query >= 0 ? rest.slice(query + 1) : '')
  const given = params.get('target_session_attrs')
  if (given !== null && !writable.includes(given)) {
    throw new ConfigError([`store.url: target_session_attrs=${given} cannot be written through; use read-write, primary or any`])
  }
  params.delete('target_session_attrs')
  const search = params.toString()
  const base = (query >= 0 ? rest.slice(0, query) : rest) + (search ? `?${search}` : '')
  const hosts = hostList.split(',').filter(Boolean).map((entry) => {
    const port = /^(.*):(\d+)$/.exec(entry)
    return port ? { host: port[1]!.replace(/^\[(.*)\]$/, '$1'), port: Number(port[2]) } : { host: entry, port: 5432 }
  })
  const first = hostList.split(',')[0] ?? ''
  return { hosts, url: head + first + base, attrs: (given as SessionAttrs | null) ?? (hosts.length > 1 ? 'read-write' : 'any') }
}

export interface PrimaryFinder {
  /** The host to open the next connection on, or undefined when none qualifies now. */
  pick(): Promise<HostPort | undefined>
  /** The host picked last failed or refused a write: ask the hosts again before the next connection. */
  forget(): void
}

/** What a probe of one host reads. */
interface HostState {
  recovery: boolean
  read_only: string
}

/**
 * The finder for `hosts`: probes every host at once on a short-lived connection of its own
 * (`SELECT pg_is_in_recovery(), current_setting('default_transaction_read_only')`) and keeps
 * the first in URL order that qualifies until `forget`. Concurrent picks share one probe.
 *
 * @example
 * const finder = createPrimaryFinder(readStoreHosts(url), 1000)
 * const target = await finder.pick() // { host: 'db2', port: 5432 }
 */
export function createPrimaryFinder(store: StoreHosts, connectTimeoutMs: number): PrimaryFinder {
  let known: HostPort | undefined
  let probing: Promise<HostPort | undefined> | undefined
  const probeAll = async () => {
    const states = await Promise.all(store.hosts.map((target) => probe(store.url, target, connectTimeoutMs)))
    return store.hosts.find((_, i) => qualifies(states[i], store.attrs))
  }
  return {
    async pick() {
      if (known) return known
      probing ??= probeAll().finally(() => (probing = undefined))
      known = await probing
      return known
    },
    forget() {
      known = undefined
    },
  }
}

function qualifies(state: HostState | undefined, attrs: SessionAttrs): boolean {
  if (!state) return false
  if (attrs === 'any') return true
  return !state.recovery && (attrs === 'primary' || state.read_only === 'off')
}

async function probe(url: string, target: HostPort, connectTimeoutMs: number): Promise<HostState | undefined> {
  const sql = postgres(url, {
    host: target.host,
    port: target.port,
    max: 1,
    fetch_types: false,
    prepare: false,
    connect_timeout: connectTimeoutMs / 1000,
    onnotice: () => {},
    connection: { application_name: 'fencegate' },
  })
  try {
    const [state] = await sql<HostState[]>`SELECT pg_is_in_recovery() AS recovery, current_setting('default_transaction_read_only') AS read_only`
    return state
  } catch {
    // Down, unreachable or refusing: it does not qualify now.
    return undefined
  } finally {
    void sql.end({ timeout: 0 }).catch(() => {})
  }
}
