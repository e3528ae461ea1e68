import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { parseConfig } from '../src/config/schema.js'
import { claimJobs, type ClaimRequest } from '../src/leases/claim.js'
import type { Db } from '../src/store/db.js'
import { backends, type TestDb } from './helpers/backends.js'

// The claim must cost the same at any queue depth: each candidate is an index scan in
// claim order that stops after the rows it takes. These tests fill a deep queue in one
// statement and read the claim's plan, so a change that brings back a sort over the
// queue (or a scan of the table) fails here rather than in production under a backlog.

const types = parseConfig({
  routes: [{ name: 'unused', method: 'POST', path: '/unused', upstream: 'http://127.0.0.1:9', fence: 'off' }],
  job_types: [{ name: 'report', lease: '45s', max_attempts: 3 }, { name: 'other', lease: '30s' }],
}).job_types
const depth = 40_000

interface PlanNode {
  'Node Type': string
  'Relation Name'?: string
  'Index Name'?: string
  'Actual Rows'?: number
  'Actual Loops'?: number
  Plans?: PlanNode[]
}

/** The same Db, with every statement sent as `EXPLAIN (options) <statement>`: the plan of exactly what the store sends. */
function explaining(db: Db, options: string): Db & { plans: PlanNode[] } {
  const plans: PlanNode[] = []
  return {
    ...db,
    plans,
    async sql<T>(strings: TemplateStringsArray, ...values: Parameters<Db['sql']>[1][]): Promise<T[]> {
      const text = [`EXPLAIN (${options}) ${strings[0]}`, ...strings.slice(1)]
      const rows = await db.sql<Record<string, unknown>>(Object.assign(text, { raw: text }) as unknown as TemplateStringsArray, ...values)
      const raw = rows[0]!['QUERY PLAN']
      const doc = (typeof raw === 'string' ? JSON.parse(raw) : raw) as { Plan: PlanNode }[]
      plans.push(doc[0]!.Plan)
      return []
    },
  }
}

/** Every node under `node`, with the node types of its ancestors (outermost first). */
function walk(node: PlanNode, ancestors: string[] = []): { node: PlanNode; ancestors: string[] }[] {
  return [{ node, ancestors }, ...(node.Plans ?? []).flatMap((child) => walk(child, [...ancestors, node['Node Type']]))]
}

/** The ways a plan could read the queue rather than its head; empty when the claim is depth-independent. */
function queueReads(plan: PlanNode): string[] {
  const problems: string[] = []
  for (const { node, ancestors } of walk(plan)) {
    if (node['Relation Name'] !== 'fg_jobs' || node['Node Type'] === 'ModifyTable') continue
    const kind = node['Node Type']
    const index = node['Index Name']
    if (kind !== 'Index Scan' && kind !== 'Index Only Scan') problems.push(`${kind} on fg_jobs`)
    else if (index === 'fg_jobs_pkey') continue
    else if (index !== 'fg_jobs_due' && index !== 'fg_jobs_expiring') problems.push(`index scan on ${index}`)
    // A head scan must be bounded by its own LIMIT, below any sort: a sort above an unbounded scan sorts the queue.
    else if (ancestors.lastIndexOf('Limit') < 0 || ancestors.lastIndexOf('Limit') < ancestors.lastIndexOf('Sort')) problems.push(`${index} scanned without a limit below the sort`)
  }
  return problems
}

describe.each(backends())('the claim reads the head of the queue, not the queue, on $name', (backend) => {
  let t: TestDb

  beforeEach(async () => {
    t = await backend.open()
    // One statement: a deep backlog of due 'report' jobs, another type's backlog, leases
    // live and expired, and finished jobs, ordered so the earliest due are not the lowest ids.
    await t.db.sql`
      INSERT INTO fg_jobs (tenant, type, key, payload, state, run_after, owner, fence, attempt, lease_until, started_at, finished_at)
      SELECT 'default', CASE WHEN g % 4 = 0 THEN 'other' ELSE 'report' END, 'k' || g, '{}'::jsonb, s.state,
             now() - interval '1 hour' + (${depth} - g) * interval '10 ms',
             CASE WHEN s.state = 'running' THEN 'w' END, CASE WHEN s.state = 'queued' THEN 0 ELSE 1 END, CASE WHEN s.state = 'queued' THEN 0 ELSE 1 END,
             -- Every other lease has expired, at the same times as the queue's due times, so reclaims interleave with it.
             CASE WHEN s.state = 'running' AND g % 20 = 1 THEN now() - interval '1 hour' + (${depth} - g) * interval '10 ms'
                  WHEN s.state = 'running' THEN now() + interval '1 hour' END,
             CASE WHEN s.state <> 'queued' THEN now() END,
             CASE WHEN s.state = 'succeeded' THEN now() END
      FROM generate_series(1, ${depth}) AS g
      CROSS JOIN LATERAL (SELECT CASE WHEN g % 10 = 1 THEN 'running' WHEN g % 10 = 2 THEN 'succeeded' ELSE 'queued' END AS state) AS s`
  })
  afterEach(async () => {
    await t.close()
  })

  const oneReport: ClaimRequest = { tenant: 'default', workerId: 'w', types: [types[0]!] }
  const shapes: [string, ClaimRequest][] = [
    ['one job of one type', oneReport],
    ['a batch of 10 over two types', { tenant: 'default', workerId: 'w', types, max: 10 }],
    ['a batch of 100 of one type', { ...oneReport, max: 100 }],
  ]

  it.each(shapes)('%s: no sort over the queue and no scan of the table, before and after ANALYZE, custom and generic plans', async (_, request) => {
    for (const analyzed of [false, true]) {
      if (analyzed) await t.db.sql`ANALYZE fg_jobs`
      for (const mode of ['force_custom_plan', 'force_generic_plan']) {
        const plans = await t.db.begin(async (tx) => {
          await tx.sql`SELECT set_config('plan_cache_mode', ${mode}, true)`
          const explain = explaining(tx, 'FORMAT JSON')
          await claimJobs(explain, request)
          return explain.plans
        })
        expect(plans).toHaveLength(1)
        expect({ analyzed, mode, problems: queueReads(plans[0]!) }).toEqual({ analyzed, mode, problems: [] })
      }
    }
  })

  it.each(shapes)('%s: reads as many index entries as it takes jobs, at a depth of tens of thousands', async (_, request) => {
    await t.db.sql`ANALYZE fg_jobs`
    const rollback = new Error('rollback')
    let plan: PlanNode | undefined
    await t.db.begin(async (tx) => {
      const explain = explaining(tx, 'ANALYZE, FORMAT JSON')
      await claimJobs(explain, request)
      plan = explain.plans[0]
      throw rollback
    }).catch((err: unknown) => {
      if (err !== rollback) throw err
    })
    const max = request.max ?? 1
    const heads = walk(plan!).map((w) => w.node).filter((n) => n['Index Name'] === 'fg_jobs_due' || n['Index Name'] === 'fg_jobs_expiring')
    expect(heads.length).toBeGreaterThanOrEqual(2)
    for (const scan of heads) expect(scan['Actual Rows']!).toBeLessThanOrEqual(max)
    const read = heads.reduce((sum, n) => sum + n['Actual Rows']! * n['Actual Loops']!, 0)
    expect(read).toBeLessThanOrEqual(2 * request.types.length * max)
  })

  it('takes the earliest due first: an expired lease before later queued jobs, then the queue in run_after order', async () => {
    const expected = await t.db.sql<{ id: string }>`
      SELECT id::text FROM fg_jobs WHERE tenant = 'default' AND type = 'report'
        AND ((state = 'queued' AND run_after <= now()) OR (state = 'running' AND lease_until <= now()))
      ORDER BY CASE WHEN state = 'running' THEN lease_until ELSE run_after END, id LIMIT 20`
    const one = await claimJobs(t.db, oneReport)
    const batch = await claimJobs(t.db, { ...oneReport, workerId: 'w2', max: 19 })
    expect([...one, ...batch].map((c) => c.job_id)).toEqual(expected.map((e) => e.id))
    expect([...one, ...batch].every((c) => c.state === 'running' && c.type === 'report')).toBe(true)
    // The expired leases among them are reclaims, with their fence raised past the old owner's.
    const reclaimed = [...one, ...batch].filter((c) => c.reclaimed)
    expect(reclaimed.length).toBeGreaterThan(0)
    expect(reclaimed.every((c) => c.fence === '2' && c.attempt === 2)).toBe(true)
  })

  // PGlite sends each statement unnamed, so only PostgreSQL keeps prepared statements to count.
  it.skipIf(backend.name === 'pglite')('plans a batch claim once per size, not on every call (regression: a bound LIMIT re-planned it each time, 362 µs a claim)', async () => {
    const cached = await t.db.begin(async (tx) => {
      for (let i = 0; i < 8; i++) await claimJobs(tx, { ...oneReport, max: 2 })
      return tx.sql<{ custom_plans: number; generic_plans: number }>`
        SELECT custom_plans::int AS custom_plans, generic_plans::int AS generic_plans FROM pg_prepared_statements
        WHERE statement LIKE '%jsonb_to_recordset%' AND statement LIKE '%LIMIT 2 FOR UPDATE SKIP LOCKED%' AND statement NOT LIKE '%pg_prepared_statements%'`
    })
    // PostgreSQL tries five custom plans, then keeps the generic one when it costs no more.
    expect(cached).toEqual([{ custom_plans: 5, generic_plans: 3 }])
  })
})
