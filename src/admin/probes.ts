import type { Hono } from 'hono'
import { z } from 'zod'
import type { DurabilityStatus } from '../store/durability.js'
import type { AdminEnv } from './query.js'

/**
 * The orchestrator's probes on the admin plane (docs/deployment.md#probes). `/livez` answers
 * whenever the process serves HTTP: a gateway whose store is down fails closed, which is its
 * job then, and restarting it would not bring the store back. `/readyz` says whether to send
 * it traffic: the store answers, its schema is at this gateway's migrations, its rules are
 * loaded, no durability refusal holds, and it is not draining.
 */

/** Why `/readyz` answers 503; the first that applies, in this order. */
export type NotReady = 'draining' | 'store' | 'migrations' | 'rules' | 'refusing'

export const readinessSchema = z.object({
  status: z.enum(['ready', 'not_ready']),
  // Absent when ready.
  reason: z.enum(['draining', 'store', 'migrations', 'rules', 'refusing']).optional(),
}).strict()

export const livenessSchema = z.object({ status: z.literal('live') }).strict()

/** What `/readyz` asks; each part is the runtime's own. */
export interface ReadinessChecks {
  /** True from the moment the gateway was told to stop (SIGTERM), before it stops accepting. */
  draining(): boolean
  /**
   * One store round trip: whether the applied migrations include every one this gateway knows.
   * Rejects when the store cannot be reached.
   */
  migrationsAtHead(): Promise<boolean>
  /** Whether a rule set is loaded (a gateway never serves without one). */
  rulesLoaded(): boolean
  durability(): DurabilityStatus
}

/**
 * Decides readiness from the checks: draining first (no store round trip is needed to say
 * no), then the store and its schema, then the rules and a durability refusal.
 *
 * @example
 * await readiness({ draining: () => true, ... }) // 'draining'
 */
export async function readiness(checks: ReadinessChecks): Promise<NotReady | undefined> {
  if (checks.draining()) return 'draining'
  let atHead: boolean
  try {
    atHead = await checks.migrationsAtHead()
  } catch {
    return 'store'
  }
  if (!atHead) return 'migrations'
  if (!checks.rulesLoaded()) return 'rules'
  if (checks.durability().refusing) return 'refusing'
  return undefined
}

/** The probe paths, answered without authentication as `/health` is: a kubelet carries no token. */
export const probePaths: ReadonlySet<string> = new Set(['/health', '/livez', '/readyz'])

/**
 * Routes `/livez`, and `/readyz` when the runtime gives its checks (without them there is no
 * readiness to tell, and `/readyz` is 404, as other optional endpoints are).
 *
 * @example
 * routeProbes(app, checks)
 */
export function routeProbes(app: Hono<AdminEnv>, checks: ReadinessChecks | undefined): void {
  app.get('/livez', (c) => c.json({ status: 'live' } satisfies z.infer<typeof livenessSchema>))
  if (!checks) return
  app.get('/readyz', async (c) => {
    const reason = await readiness(checks)
    // No caching anywhere between: a stale "ready" is what a drain must not meet.
    c.header('cache-control', 'no-store')
    if (reason) return c.json({ status: 'not_ready', reason } satisfies z.infer<typeof readinessSchema>, 503)
    return c.json({ status: 'ready' } satisfies z.infer<typeof readinessSchema>)
  })
}
