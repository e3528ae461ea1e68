import { concatBytes } from '../http/body.js'
import type { Answer, HeaderView } from '../http/exchange.js'
import type { RouteConfig } from '../config/schema.js'
import { captureBody, storedHeaders, type Captured } from './idempotency.js'
import type { Logger } from '../observe/log.js'
import { FencegateError } from '../http/problems.js'
import { storeCode } from '../store/db.js'
import type { Held, Store } from '../store/store.js'

/**
 * An answer up to this size whose length the upstream declared is read whole,
 * stored, and then sent in one piece: the client could not finish it before
 * the record was stored anyway, and one write is much cheaper than streaming
 * its headers, chunks and end separately. Larger or undeclared answers stream.
 */
export const wholeAnswerLimit = 64 * 1024

/**
 * Decides what becomes of a held key once the upstream answered: a transient
 * status releases it (the next attempt forwards again); anything else is
 * stored for replay (or as `not_replayable` when larger than
 * `max_stored_body`) before the client can have all of it. A small answer of
 * declared length is read whole first (`wholeAnswerLimit`); any other is
 * streamed to the client while captured, its last chunk released only once
 * the record is stored. Returns the body to send to the client.
 */
export async function settleResponse(o: {
  store: Store
  log: Logger
  route: RouteConfig
  held: Held
  upstream: Answer
  requestId: string
}): Promise<Uint8Array | ReadableStream<Uint8Array> | null> {
  const { store, log, route, held, upstream, requestId } = o
  if (route.transient_statuses.includes(upstream.status)) {
    await logged(log, requestId, 'release', () => store.release(held))
    return upstream.body
  }
  const headers = storedHeaders(upstream.headers, route.replay_headers)
  const record = async (captured: Captured) => {
    const settled = captured.kind === 'complete'
      ? store.complete(held, { replayable: true, response: { status: upstream.status, headers, body: captured.body }, ttlMs: route.idempotency_ttl })
      // Too large, or the body broke after the upstream answered: it happened, but cannot be replayed.
      : store.complete(held, { replayable: false, response: { status: upstream.status, headers, body: new Uint8Array(0) }, ttlMs: route.idempotency_ttl })
    await logged(log, requestId, 'complete', () => settled)
  }
  if (upstream.body instanceof Uint8Array) {
    // Read whole by the Forward: stored (or, past max_stored_body, marked not replayable) before it is sent.
    await record(upstream.body.byteLength <= route.max_stored_body ? { kind: 'complete', body: upstream.body } : { kind: 'too_large' })
    return upstream.body
  }
  const declared = declaredLength(upstream.headers)
  if (upstream.body && declared !== undefined && declared <= Math.min(route.max_stored_body, wholeAnswerLimit)) {
    const read = await readWhole(upstream.body, declared)
    await record(read.ok ? { kind: 'complete', body: read.body } : { kind: 'broken' })
    // Nothing has reached the client yet, so it can be told plainly instead of getting a cut-off body.
    if (!read.ok) throw new FencegateError('upstream_unreachable', "the upstream's answer broke off before its end; it was recorded as not replayable and is not executed again")
    return read.body
  }
  return captureBody(upstream.body, route.max_stored_body, record)
}

function declaredLength(headers: HeaderView): number | undefined {
  const value = headers.get('content-length')
  return value !== null && /^\d{1,15}$/.test(value) ? Number(value) : undefined
}

type Whole = { ok: true; body: Uint8Array<ArrayBuffer> } | { ok: false }

/** Reads a body of declared length to its end; a read error or another length means it broke. */
async function readWhole(body: ReadableStream<Uint8Array>, declared: number): Promise<Whole> {
  const reader = body.getReader()
  const read: Uint8Array[] = []
  let size = 0
  try {
    for (;;) {
      const next = await reader.read()
      if (next.done) break
      read.push(next.value)
      size += next.value.byteLength
      if (size > declared) throw new Error('more than its Content-Length')
    }
  } catch {
    await reader.cancel().catch(() => {})
    return { ok: false }
  }
  if (size !== declared) return { ok: false }
  return { ok: true, body: concatBytes(read, size) as Uint8Array<ArrayBuffer> }
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
