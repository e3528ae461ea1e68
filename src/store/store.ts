import type { Db } from './db.js'
import { bumpFence, type Bump, type BumpResult } from './fences.js'
import { acquireSlot, releaseSlot, type SlotDecision, type SlotRequest } from './ordering.js'
import { createCompleter, type Completion, type Schedule } from './completions.js'
import {
  getKey, markUnknown, purgeExpired, release, releaseUnknown, reserve,
  type Command, type Held, type KeyState, type Reservation,
} from './commands.js'

/** One rejected command, as written to the audit table. */
export interface Rejection {
  tenant: string
  route: string | null
  entity: string | null
  code: string
  presentedFence: string | null
  highestFence: string | null
  method: string
  path: string
  bodySha256: string | null
  caller: string | null
  requestId: string
  idempotencyKey?: string | null
}

/** Filters for reading the audit trail, newest first. Times are on the database clock. */
export interface AuditQuery {
  tenant?: string
  entity?: string
  code?: string
  route?: string
  /** ISO timestamp or, with sinceMs, a window ending at the database's now(). */
  since?: string
  sinceMs?: number
  until?: string
  untilMs?: number
  limit: number
  /** Return rows with an id below this one (keyset pagination). */
  before?: string
}

export interface AuditItem {
  id: string
  at: string
  tenant: string
  route: string | null
  entity: string | null
  code: string
  presented_fence: string | null
  highest_fence: string | null
  method: string
  path: string
  body_sha256: string | null
  caller: string | null
  request_id: string
  idempotency_key: string | null
}

export interface EntityState {
  tenant: string
  entity: string
  highest_fence: string
  updated_at: string
  /** The request that last presented the highest fence. */
  request_id: string
}

export type { Bump, BumpResult } from './fences.js'
export type { SlotDecision, SlotRequest } from './ordering.js'
export type { Command, Held, IdempotencyClaim, KeyState, Reservation, StoredResponse } from './commands.js'

/**
 * Everything the gateway asks of its database. Each method is one statement,
 * so each decision is atomic and costs one round trip; `complete` may share its
 * statement with the other completions of the same scheduled turn.
 */
export interface Store {
  /** Presents the fence and reserves the idempotency key, in one statement (see commands.ts). */
  reserve(command: Command): Promise<Reservation>
  /** Stores a response for replay; completions of one scheduled turn share a statement (see completions.ts). */
  complete(held: Held, outcome: Completion): Promise<boolean>
  release(held: Held): Promise<boolean>
  markUnknown(held: Held): Promise<boolean>
  getKey(tenant: string, key: string): Promise<KeyState | undefined>
  releaseUnknown(request: { tenant: string; key: string; caller: string | null; requestId: string }): Promise<{ released: boolean; state: string } | undefined>
  purgeExpired(limit: number): Promise<number>
  /** Writes one audit row for a command rejected before it reached the fence. */
  recordRejection(rejection: Rejection): Promise<void>
  listAudit(query: AuditQuery): Promise<AuditItem[]>
  getEntity(tenant: string, entity: string): Promise<EntityState | undefined>
  /** Raises an entity's fence floor, audited as `fence_bumped` (see fences.ts). */
  bumpFence(bump: Bump): Promise<BumpResult>
  /** Takes an entity's delivery slot for `ordering: serialize` (see ordering.ts). */
  acquireSlot(request: SlotRequest): Promise<SlotDecision>
  releaseSlot(request: Pick<SlotRequest, 'tenant' | 'entity' | 'token'>): Promise<void>
  /** Resolves when the store answers a trivial query. */
  ping(): Promise<void>
  close(): Promise<void>
}

export interface StoreOptions {
  /**
   * When a batch of completions is written (see completions.ts). Node passes
   * `setImmediate`: every completion of one event-loop turn shares a statement.
   */
  schedule?: Schedule
}

// Timestamps are rendered by the database (ISO-8601, UTC, microseconds) so both drivers agree.

/**
 * Builds the Store on any Db (PostgreSQL or PGlite): the SQL lives here, once.
 *
 * @example
 * const store = createStore(await openPglite(), { schedule: setImmediate })
 */
export function createStore(db: Db, options: StoreOptions = {}): Store {
  const completer = createCompleter(db, options.schedule)
  return {
    reserve: (command) => reserve(db, command),
    complete: completer.complete,
    release: (held) => release(db, held),
    markUnknown: (held) => markUnknown(db, held),
    getKey: (tenant, key) => getKey(db, tenant, key),
    releaseUnknown: (request) => releaseUnknown(db, request),
    purgeExpired: (limit) => purgeExpired(db, limit),

    async recordRejection(r) {
      await db.sql`
        INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, highest_fence,
                              method, path, body_sha256, caller, request_id, idempotency_key)
        VALUES (${r.tenant}, ${r.route}, ${r.entity}, ${r.code}, ${r.presentedFence}::bigint, ${r.highestFence}::bigint,
                ${r.method}, ${r.path}, ${r.bodySha256}, ${r.caller}, ${r.requestId}, ${r.idempotencyKey})`
    },

    async listAudit(q) {
      return db.sql<AuditItem>`
        SELECT id::text, to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS at, tenant, route, entity, code,
               presented_fence::text, highest_fence::text, method, path, body_sha256, caller, request_id, idempotency_key
        FROM fg_audit
        WHERE (${q.tenant}::text IS NULL OR tenant = ${q.tenant})
          AND (${q.entity}::text IS NULL OR entity = ${q.entity})
          AND (${q.code}::text IS NULL OR code = ${q.code})
          AND (${q.route}::text IS NULL OR route = ${q.route})
          AND (${q.since}::timestamptz IS NULL OR at >= ${q.since}::timestamptz)
          AND (${q.sinceMs}::bigint IS NULL OR at >= now() - ${q.sinceMs}::bigint * interval '1 millisecond')
          AND (${q.until}::timestamptz IS NULL OR at < ${q.until}::timestamptz)
          AND (${q.untilMs}::bigint IS NULL OR at < now() - ${q.untilMs}::bigint * interval '1 millisecond')
          AND (${q.before}::bigint IS NULL OR fg_audit.id < ${q.before}::bigint)
        -- The table's bigint column, not the text alias of the same name: ids must sort as numbers.
        ORDER BY fg_audit.id DESC
        LIMIT ${q.limit}`
    },

    async getEntity(tenant, entity) {
      const rows = await db.sql<EntityState>`
        SELECT tenant, entity, highest_fence::text, to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS updated_at, request_id
        FROM fg_fences WHERE tenant = ${tenant} AND entity = ${entity}`
      return rows[0]
    },

    bumpFence: (bump) => bumpFence(db, bump),
    acquireSlot: (request) => acquireSlot(db, request),
    releaseSlot: (request) => releaseSlot(db, request),

    async ping() {
      await db.sql`SELECT 1`
    },

    async close() {
      // A completion still waiting for its turn's flush is written before the connections go.
      await completer.drain()
      await db.close()
    },
  }
}
