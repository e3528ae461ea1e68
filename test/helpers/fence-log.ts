import { expect } from 'vitest'
import type { Db } from '../../src/store/db.js'

/**
 * Installs a test-only trigger that records every change to fg_fences in the
 * order the row lock serialised them: (old highest, new highest, request id).
 */
export async function installFenceLog(db: Db): Promise<void> {
  await db.exec(`
    CREATE TABLE test_fence_log (seq bigint GENERATED ALWAYS AS IDENTITY, old_fence bigint, new_fence bigint, request_id text);
    CREATE FUNCTION test_log_fence() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      INSERT INTO test_fence_log (old_fence, new_fence, request_id)
      VALUES (CASE WHEN TG_OP = 'UPDATE' THEN OLD.highest_fence END, NEW.highest_fence, NEW.request_id);
      RETURN NEW;
    END $$;
    CREATE TRIGGER test_log_fence AFTER INSERT OR UPDATE ON fg_fences FOR EACH ROW EXECUTE FUNCTION test_log_fence();`)
}

export interface Outcome {
  requestId: string
  fence: number
  status: number
  body: any
}

/**
 * Checks the fence rule over a concurrent run on one entity:
 * - every answer is 200 (forwarded) or 409 stale_fence;
 * - the upstream saw exactly the accepted fences;
 * - each accepted request was >= the highest recorded when the store accepted it, or (an
 *   equal fence, decided by a read) presented a fence the entity was raised to;
 * - each rejected request reports a highest above its own that an accepted request carried;
 * - the final highest equals the maximum forwarded fence.
 */
export async function checkFenceOrder(db: Db, outcomes: Outcome[], forwardedFences: number[], finalHighest: string): Promise<void> {
  for (const o of outcomes) expect([200, 409], JSON.stringify(o.body)).toContain(o.status)
  const accepted = outcomes.filter((o) => o.status === 200)
  const rejected = outcomes.filter((o) => o.status === 409)
  expect(accepted.length).toBeGreaterThan(0)
  expect(rejected.length).toBeGreaterThan(0)
  expect([...forwardedFences].sort((a, b) => a - b)).toEqual(accepted.map((o) => o.fence).sort((a, b) => a - b))

  const log = await db.sql<{ old_fence: string | null; new_fence: string; request_id: string }>`
    SELECT old_fence::text, new_fence::text, request_id FROM test_fence_log ORDER BY seq`
  for (let i = 1; i < log.length; i++) {
    expect(log[i]!.old_fence).toBe(log[i - 1]!.new_fence)
    expect(BigInt(log[i]!.new_fence) >= BigInt(log[i - 1]!.new_fence)).toBe(true)
  }
  // A request id first appears in the log in the update that accepted it; later rows
  // with the same id are rejections that left the row as it was.
  const acceptedAt = new Map<string, (typeof log)[number]>()
  for (const l of log) if (!acceptedAt.has(l.request_id)) acceptedAt.set(l.request_id, l)
  // A fence equal to the highest on the statement's snapshot is accepted by that read and
  // writes nothing: it must then be a fence the log shows the entity was raised to.
  const raisedTo = new Set(log.map((l) => l.new_fence))
  for (const o of accepted) {
    const entry = acceptedAt.get(o.requestId)
    if (entry === undefined) {
      expect(raisedTo.has(String(o.fence)), `no acceptance recorded for ${o.requestId}`).toBe(true)
      continue
    }
    expect(entry.new_fence).toBe(String(o.fence))
    if (entry.old_fence !== null) expect(BigInt(entry.old_fence) <= BigInt(o.fence)).toBe(true)
  }
  const acceptedFences = new Set(accepted.map((o) => String(o.fence)))
  for (const o of rejected) {
    expect(o.body.code).toBe('stale_fence')
    expect(o.body.presented_fence).toBe(String(o.fence))
    expect(BigInt(o.body.highest_fence) > BigInt(o.fence)).toBe(true)
    expect(acceptedFences.has(o.body.highest_fence)).toBe(true)
  }
  expect(finalHighest).toBe(String(Math.max(...forwardedFences)))
}
