import type { RouteConfig } from './config/schema.js'
import { captureBody, storedHeaders, type Captured } from './idempotency.js'
import type { Logger } from './log.js'
import { storeCode } from './store/db.js'
import type { Held, Store } from './store/store.js'

/**
 * Decides what becomes of a held key once the upstream answered: a transient
 * status releases it (the next attempt forwards again); anything else is
 * streamed to the client while captured, and stored for replay (or as
 * `not_replayable` when larger than `max_stored_body`) before the last chunk
 * is released. Returns the body to send to the client.
 */
export async function settleResponse(o: {
  store: Store
  log: Logger
  route: RouteConfig
  held: Held
  upstream: Response
  requestId: string
}): Promise<ReadableStream<Uint8Array> | null> {
  const { store, log, route, held, upstream, requestId } = o
  if (route.transient_statuses.includes(upstream.status)) {
    await logged(log, requestId, 'release', () => store.release(held))
    return upstream.body
  }
  const headers = storedHeaders(upstream.headers)
  return captureBody(upstream.body, route.max_stored_body, async (captured: Captured) => {
    const settled = captured.kind === 'complete'
      ? store.complete(held, { replayable: true, response: { status: upstream.status, headers, body: captured.body }, ttlMs: route.idempotency_ttl })
      // Too large, or the body broke after the upstream answered: it happened, but cannot be replayed.
      : store.complete(held, { replayable: false, response: { status: upstream.status, headers, body: new Uint8Array(0) }, ttlMs: route.idempotency_ttl })
    await logged(log, requestId, 'complete', () => settled)
  })
}

/**
 * Runs a store write whose failure must not change the client's answer: the
 * record then stays in flight and becomes an unknown outcome when its lock ends.
 */
export async function logged(log: Logger, requestId: string, action: string, write: () => Promise<boolean>): Promise<void> {
  try {
    if (!(await write())) log.warn('idempotency_record_lost', { request_id: requestId, action })
  } catch (err) {
    log.error('idempotency_write_failed', { request_id: requestId, action, store_code: storeCode(err) })
  }
}

/**
 * Holds a duplicate until the original settles (`idempotency_wait`), polling
 * the record with a growing interval; true when it left `in_flight` in time.
 */
export async function waitForOutcome(store: Store, tenant: string, key: string, waitMs: number): Promise<boolean> {
  const deadline = Date.now() + waitMs
  for (let interval = 20; Date.now() < deadline; interval = Math.min(interval * 2, 250)) {
    await new Promise((resolve) => setTimeout(resolve, Math.min(interval, Math.max(0, deadline - Date.now()))))
    const record = await store.getKey(tenant, key)
    if (!record || record.state !== 'in_flight') return true
  }
  return false
}
