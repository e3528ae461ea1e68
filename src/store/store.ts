import type { Db } from './db.js'
import { durably, localDurability, type Durability } from './durability.js'
import { bumpFence, type Bump, type BumpResult } from './fences.js'
import { acquireSlot, releaseSlot, type SlotDecision, type SlotRequest } from './ordering.js'
import { createCompleter, type Completion, type Schedule } from './completions.js'
import { listAudit, purgeAudit, recordRejection, summarizeAudit, type AuditBucket, type AuditFilter, type AuditItem, type AuditQuery, type Rejection } from './audit.js'
import { listFenceHistory, purgeFenceHistory, type FenceChange, type FenceHistoryQuery } from './fence-history.js'
import { reserve, type Command, type Reservation } from './commands.js'
import { createPresenter } from './present.js'
import { createKeyReserver } from './reserve-keys.js'
import { getKey, listEntityKeys, markUnknown, purgeExpired, release, releaseUnknown, type EntityKey, type Held, type KeyRelease, type KeyState } from './keys.js'

export type { AuditBucket, AuditFilter, AuditItem, AuditQuery, Rejection } from './audit.js'
export type { FenceChange, FenceHistoryQuery } from './fence-history.js'
export type { EntityKey } from './keys.js'

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
export type { Command, IdempotencyClaim, Reservation, StoredResponse } from './commands.js'
export type { Held, KeyRelease, KeyState } from './keys.js'

/**
 * Everything the gateway asks of its database. Each method is one statement,
 * so each decision is atomic and costs one round trip; a command without a lease, and `complete`,
 * may share a statement with the others of the same scheduled turn.
 */
export interface Store {
  /** Presents the fence and reserves the idempotency key, in one call and one transaction (see commands.ts). */
  reserve(command: Command): Promise<Reservation>
  /** Stores a response for replay; completions of one scheduled turn share a statement (see completions.ts). */
  complete(held: Held, outcome: Completion): Promise<boolean>
  release(held: Held): Promise<boolean>
  markUnknown(held: Held): Promise<boolean>
  getKey(tenant: string, key: string): Promise<KeyState | undefined>
  releaseUnknown(request: KeyRelease): Promise<{ released: boolean; state: string } | undefined>
  purgeExpired(limit: number): Promise<number>
  /** Writes one audit row for a command rejected before it reached the fence. */
  recordRejection(rejection: Rejection): Promise<void>
  listAudit(query: AuditQuery): Promise<AuditItem[]>
  /** Counts rejections by code per time bucket (see audit.ts). */
  summarizeAudit(filter: AuditFilter, bucketMs: number): Promise<AuditBucket[]>
  /** Deletes up to `limit` audit rows older than `olderThanMs`; returns how many went. */
  purgeAudit(olderThanMs: number, limit: number): Promise<number>
  /** One entity's fence changes, newest first (see fence-history.ts). */
  listFenceHistory(query: FenceHistoryQuery): Promise<FenceChange[]>
  purgeFenceHistory(olderThanMs: number, limit: number): Promise<number>
  /** An entity's live idempotency records, newest first, without bodies. */
  listEntityKeys(tenant: string, entity: string, limit: number): Promise<EntityKey[]>
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
   * When a batch of fences or completions is written (see present.ts, completions.ts). Node
   * passes `setImmediate`: every fence, and every completion, of one event-loop turn shares a statement.
   */
  schedule?: Schedule
  /**
   * What the store can lose (src/store/durability.ts): every reservation is admitted by it
   * and its WAL position observed before the command may be forwarded. Defaults to none checked.
   */
  durability?: Durability
}

// Timestamps are rendered by the database (ISO-8601, UTC, microseconds) so both drivers agree.

/**
 * Builds the Store on any Db (PostgreSQL or PGlite): the SQL lives here, once.
 *
 * @example
 * const store = createStore(await openPglite(), { schedule: setImmediate })
 */
export function createStore(db: Db, options: StoreOptions = {}): Store {
  const durability = options.durability ?? localDurability
  const completer = createCompleter(db, options.schedule, durability)
  const presenter = createPresenter(db, options.schedule)
  const keys = createKeyReserver(db, options.schedule)
  // A fence alone shares its statement with the other fences of the turn (present.ts), a keyed
  // command with the other keyed ones (reserve-keys.ts); a lease-bound command goes alone.
  const decide = (c: Command) => (c.leaseJob ? reserve(db, c) : c.idempotency ? keys.reserve(c) : presenter.present(c))
  return {
    async reserve(command) {
      return (await durably(durability, () => decide(command), (r) => r.position)).reservation
    },
    complete: completer.complete,
    release: (held) => release(db, held),
    markUnknown: (held) => markUnknown(db, held),
    getKey: (tenant, key) => getKey(db, tenant, key),
    releaseUnknown: (request) => releaseUnknown(db, request),
    purgeExpired: (limit) => purgeExpired(db, limit),

    recordRejection: (rejection) => recordRejection(db, rejection),
    listAudit: (query) => listAudit(db, query),
    summarizeAudit: (filter, bucketMs) => summarizeAudit(db, filter, bucketMs),
    purgeAudit: (olderThanMs, limit) => purgeAudit(db, olderThanMs, limit),
    listFenceHistory: (query) => listFenceHistory(db, query),
    purgeFenceHistory: (olderThanMs, limit) => purgeFenceHistory(db, olderThanMs, limit),
    listEntityKeys: (tenant, entity, limit) => listEntityKeys(db, tenant, entity, limit),

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
      // A fence or a completion still waiting for its turn's flush is written before the connections go.
      await presenter.drain()
      await keys.drain()
      await completer.drain()
      await db.close()
    },
  }
}
