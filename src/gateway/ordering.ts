import { staleFenceError } from './fence.js'
import type { Logger } from '../observe/log.js'
import { FencegateError, retryAfter } from '../http/problems.js'
import { storeCode } from '../store/db.js'
import type { SlotRequest, Store } from '../store/store.js'

/**
 * Waits for an entity's delivery slot (`ordering: serialize`): at most one
 * forwarded command per entity at a time, so the upstream sees an entity's
 * commands in non-decreasing fence order. Each attempt is one statement that
 * re-checks the fence (src/store/ordering.ts); between attempts it polls with
 * a growing interval. The deadline is this request's own timeout on the
 * process's monotonic clock, not a lease decision: every ownership decision
 * stays in the statement, on the database clock.
 *
 * @example
 * await takeSlot(store, { tenant, entity: 'invoice:42', fence: '7', token, holdMs: 11_000 }, 5000)
 */
export async function takeSlot(store: Store, slot: SlotRequest, waitMs: number): Promise<void> {
  const deadline = performance.now() + waitMs
  for (let pause = 5; ; pause = Math.min(pause * 2, 100)) {
    const decision = await store.acquireSlot(slot)
    if (decision.kind === 'acquired') return
    if (decision.kind === 'stale') throw staleFenceError(slot.entity, slot.fence, decision.highest)
    const left = deadline - performance.now()
    if (left <= 0) {
      throw new FencegateError('entity_busy', `another command for ${slot.entity} is still being delivered; this one waited ${waitMs} ms`, { entity: slot.entity }, retryAfter(decision.retryAfterMs))
    }
    await new Promise((resolve) => setTimeout(resolve, Math.min(pause, left)))
  }
}

/** Gives the slot back; if that fails the slot frees itself when its hold ends, on the database clock. */
export async function giveSlotBack(store: Store, log: Logger, requestId: string, slot: SlotRequest): Promise<void> {
  try {
    await store.releaseSlot(slot)
  } catch (err) {
    log.error('slot_release_failed', { request_id: requestId, entity: slot.entity, store_code: storeCode(err) })
  }
}
