import { createLocalJWKSet, errors, type JSONWebKeySet, type JWTVerifyGetKey } from 'jose'

/** How a remote key set is fetched and how often; every field has a default. */
export interface KeySetOptions {
  /** The clock, in ms (default `Date.now`). */
  now?: () => number
  /** Default: the runtime's `fetch`. */
  fetch?: typeof fetch
  /** An unknown `kid` refetches at most this often, successful or not (default 1000 ms). */
  minFetchIntervalMs?: number
  /** A set older than this is refreshed in the background, off the request's path (default 300000 ms). */
  refreshAfterMs?: number
  /** A fetch that takes longer fails (default 5000 ms). */
  timeoutMs?: number
  /**
   * Whether concurrent requests share one fetch in flight (default true). The Workers entry passes false:
   * workerd forbids one request to await I/O that another request started.
   */
  sharePending?: boolean
}

/** The key set could not be fetched, and no key fetched before matches the token. */
export class KeySetUnavailable extends Error {
  constructor(readonly reason: string) {
    super(`the key set could not be fetched (${reason})`)
  }
}

/** A remote key set with its fetch state, for jose's `jwtVerify`. */
export interface RemoteKeySet {
  getKey: JWTVerifyGetKey
  /** Fetches now; throws a `KeySetUnavailable` naming why. */
  refresh(): Promise<void>
}

/**
 * A JWKS endpoint's keys, refetched when an identity provider rotates: an unknown `kid` refetches at once
 * (at most once per `minFetchIntervalMs`, so unknown kids cannot flood the provider), a stale set refreshes in
 * the background, and keys already fetched keep verifying while the provider is down, until a successful fetch
 * withdraws them. jose's remote set refetches only after its cooldown (a new kid is refused meanwhile) and, once
 * the set is stale, fails known keys with the provider.
 *
 * @example
 * const keys = createRemoteKeySet(new URL('https://idp.example/.well-known/jwks.json'))
 * await keys.refresh() // at start: a wrong URL fails here, not on every request
 * await jwtVerify(token, keys.getKey, { issuer, audience })
 */
export function createRemoteKeySet(url: URL, options: KeySetOptions = {}): RemoteKeySet {
  const now = options.now ?? Date.now
  const fetchImpl = options.fetch ?? fetch
  const minInterval = options.minFetchIntervalMs ?? 1000
  const refreshAfter = options.refreshAfterMs ?? 300_000
  const timeoutMs = options.timeoutMs ?? 5000
  let local: ReturnType<typeof createLocalJWKSet> | undefined
  let fetchedAt = -Infinity
  let attemptedAt = -Infinity
  let lastFailure: string | undefined
  let pending: Promise<void> | undefined

  const fetchOnce = async (): Promise<void> => {
    attemptedAt = now()
    try {
      const set = await fetchSet(fetchImpl, url, timeoutMs)
      local = createLocalJWKSet(set)
      fetchedAt = now()
      lastFailure = undefined
    } catch (err) {
      lastFailure = err instanceof KeySetUnavailable ? err.reason : describeFetchError(err)
      throw new KeySetUnavailable(lastFailure)
    }
  }
  const refresh = (): Promise<void> => {
    if (options.sharePending === false) return fetchOnce()
    pending ??= fetchOnce().finally(() => { pending = undefined })
    return pending
  }
  const mayFetch = () => now() - attemptedAt >= minInterval

  const getKey: JWTVerifyGetKey = async (header, token) => {
    if (local) {
      try {
        const key = await local(header, token)
        if (now() - fetchedAt >= refreshAfter && mayFetch()) refresh().catch(() => {})
        return key
      } catch (err) {
        if (!(err instanceof errors.JWKSNoMatchingKey)) throw err
      }
    }
    // An unknown kid: the provider may have rotated since the last fetch (or a fetch in flight may bring it).
    if (pending) await pending.catch(() => {})
    else if (mayFetch()) await refresh().catch(() => {})
    if (!local) throw new KeySetUnavailable(lastFailure ?? 'not fetched yet')
    try {
      return await local(header, token)
    } catch (err) {
      if (err instanceof errors.JWKSNoMatchingKey && lastFailure !== undefined) throw new KeySetUnavailable(lastFailure)
      throw err
    }
  }
  return { getKey, refresh }
}

async function fetchSet(fetchImpl: typeof fetch, url: URL, timeoutMs: number): Promise<JSONWebKeySet> {
  const res = await fetchImpl(url, {
    headers: { accept: 'application/json, application/jwk-set+json' },
    signal: AbortSignal.timeout(timeoutMs),
    redirect: 'manual',
  })
  if (res.status !== 200) {
    await res.body?.cancel()
    throw new KeySetUnavailable(`HTTP ${res.status}`)
  }
  let body: unknown
  try {
    body = await res.json()
  } catch {
    throw new KeySetUnavailable('the answer is not JSON')
  }
  const keys = (body as { keys?: unknown } | null)?.keys
  if (!Array.isArray(keys) || !keys.every((k) => typeof k === 'object' && k !== null)) {
    throw new KeySetUnavailable('the answer is not a JWK set')
  }
  return body as JSONWebKeySet
}

/** Names, not messages: the reason reaches logs and a client's problem detail. */
function describeFetchError(err: unknown): string {
  const name = (err as { name?: string })?.name
  if (name === 'TimeoutError' || name === 'AbortError') return 'timed out'
  const code = (err as { cause?: { code?: string } })?.cause?.code
  return code ? `connection failed: ${code}` : 'connection failed'
}
