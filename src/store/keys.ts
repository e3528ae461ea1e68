import type { Db } from './db.js'

// A key's record after its reservation (src/store/commands.ts): settled by its owner as
// released or unknown, read by the admin plane, released by an operator, purged once expired.

/** Which reservation an outcome is for: only its owner may settle it. */
export interface Held {
  tenant: string
  key: string
  ownerToken: string
}

/** Frees the key after an answer that proves nothing happened (refused connection, transient status). */
export async function release(db: Db, held: Held): Promise<boolean> {
  const rows = await db.sql`
    DELETE FROM fg_idempotency
    WHERE tenant = ${held.tenant} AND key = ${held.key} AND owner_token = ${held.ownerToken} AND state = 'in_flight'
    RETURNING 1`
  return rows.length === 1
}

/** Records that the request may have reached the upstream but its answer was lost. */
export async function markUnknown(db: Db, held: Held): Promise<boolean> {
  const rows = await db.sql`
    UPDATE fg_idempotency SET state = 'outcome_unknown', locked_until = NULL
    WHERE tenant = ${held.tenant} AND key = ${held.key} AND owner_token = ${held.ownerToken} AND state = 'in_flight'
    RETURNING 1`
  return rows.length === 1
}

/** An idempotency record as operators see it: never the stored body. */
export interface KeyState {
  tenant: string
  key: string
  state: 'in_flight' | 'completed' | 'outcome_unknown' | 'not_replayable'
  fingerprint: string
  route: string
  entity: string | null
  fence: string | null
  status: number | null
  attempt: number
  request_id: string
  created_at: string
  completed_at: string | null
  locked_until: string | null
  expires_at: string
}

export async function getKey(db: Db, tenant: string, key: string): Promise<KeyState | undefined> {
  const rows = await db.sql<KeyState>`
    SELECT tenant, key, state, fingerprint, route, entity, fence::text, status, attempt, request_id,
           to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_at,
           to_char(completed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS completed_at,
           to_char(locked_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS locked_until,
           to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS expires_at
    FROM fg_idempotency WHERE tenant = ${tenant} AND key = ${key} AND expires_at > now()`
  return rows[0]
}

/** An operator's release of a key, and the admin request's trace for its audit row (null or absent when untraced). */
export interface KeyRelease {
  tenant: string
  key: string
  caller: string | null
  requestId: string
  traceId?: string | null
}

/**
 * Deletes an `outcome_unknown` record (or an in-flight one whose lock expired)
 * after an operator reconciled it with the upstream, and audits who did it.
 * Returns the state it found, or undefined when there was no live record.
 */
export async function releaseUnknown(db: Db, r: KeyRelease): Promise<{ released: boolean; state: string } | undefined> {
  const [row] = await db.sql<{ state: string; released: boolean }>`
    WITH target AS (
      SELECT tenant, key, state, route, entity, fence,
             (state = 'outcome_unknown' OR (state = 'in_flight' AND locked_until <= now())) AS releasable
      FROM fg_idempotency WHERE tenant = ${r.tenant} AND key = ${r.key} AND expires_at > now()
      FOR UPDATE
    ), removed AS (
      DELETE FROM fg_idempotency AS i USING target AS t
      WHERE i.tenant = t.tenant AND i.key = t.key AND t.releasable
      RETURNING i.key
    ), audited AS (
      INSERT INTO fg_audit (tenant, route, entity, code, presented_fence, method, path, caller, request_id, idempotency_key, trace_id)
      SELECT t.tenant, t.route, t.entity, 'idempotency_key_released', t.fence, 'DELETE', '/idempotency', ${r.caller}, ${r.requestId}, t.key, ${r.traceId}::text
      FROM target AS t WHERE t.releasable
      RETURNING id
    )
    SELECT state, releasable AS released FROM target`
  return row
}

/**
 * Deletes up to `limit` expired records; returns how many went. It passes over a record a
 * reservation or a completion holds (SKIP LOCKED) rather than waiting for it: the purge takes
 * its rows in expiry order, not in the (tenant, key) order batches lock keys in, so waiting
 * could close a deadlock with a batch that reuses an expired key. A passed-over record is
 * taken by a later purge, or replaced by the reservation that held it.
 */
export async function purgeExpired(db: Db, limit: number): Promise<number> {
  const rows = await db.sql`
    DELETE FROM fg_idempotency WHERE ctid = ANY (ARRAY(
      SELECT ctid FROM fg_idempotency WHERE expires_at <= now() ORDER BY expires_at LIMIT ${limit} FOR UPDATE SKIP LOCKED
    )) AND expires_at <= now()
    RETURNING 1`
  return rows.length
}

/** An entity's idempotency record in a list: what an operator needs, never a body or a fingerprint. */
export type EntityKey = Pick<KeyState, 'key' | 'state' | 'route' | 'fence' | 'status' | 'attempt' | 'request_id' | 'created_at' | 'completed_at' | 'expires_at'>

/**
 * An entity's live idempotency records, newest first (at most `limit`). There is
 * no index on the entity: the table holds only live keys (purged at expiry), and
 * an index would cost every reservation a write for the sake of a console view.
 */
export async function listEntityKeys(db: Db, tenant: string, entity: string, limit: number): Promise<EntityKey[]> {
  return db.sql<EntityKey>`
    SELECT key, state, route, fence::text AS fence, status, attempt, request_id,
           to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS created_at,
           to_char(completed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS completed_at,
           to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS expires_at
    FROM fg_idempotency
    WHERE tenant = ${tenant} AND entity = ${entity} AND expires_at > now()
    ORDER BY fg_idempotency.created_at DESC, fg_idempotency.key
    LIMIT ${limit}`
}
