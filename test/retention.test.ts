import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { createPromMetrics } from '../src/runtime/node/metrics.js'
import { noMetrics, type Metrics } from '../src/observe/metrics.js'
import { purgeOnce } from '../src/runtime/retention.js'
import { purgeRetainedOnWorkers } from '../src/runtime/workers/retention.js'
import { backends, type TestDb } from './helpers/backends.js'
import { route, testConfig } from './helpers/gateway.js'

const retentions = (audit?: string, history?: string) =>
  testConfig([route('http://127.0.0.1:9')], { ...(audit ? { audit: { retention: audit } } : {}), ...(history ? { fence_history: { retention: history } } : {}) })

describe('retention configuration', () => {
  it('takes durations of an hour or more, and keeps rows forever when absent', () => {
    expect(retentions('90d', '12h').audit.retention).toBe(90 * 86_400_000)
    expect(retentions('90d', '12h').fence_history.retention).toBe(12 * 3_600_000)
    expect(retentions().audit.retention).toBeUndefined()
    expect(retentions().fence_history.retention).toBeUndefined()
    expect(() => retentions('90')).toThrow(/audit\.retention/)
    expect(() => retentions(undefined, 'soon')).toThrow(/fence_history\.retention/)
    expect(() => testConfig([route('http://127.0.0.1:9')], { audit: { keep: '1d' } })).toThrow(/audit/)
  })
})

describe.each(backends())('retention purge ($name)', (backend) => {
  let t: TestDb
  beforeEach(async () => {
    t = await backend.open()
  })
  afterEach(async () => {
    await t.close()
  })

  /** `old` rows two hours old and `fresh` rows of now, in both tables. */
  async function seed(old: number, fresh: number) {
    await t.db.sql`
      INSERT INTO fg_audit (at, tenant, code, method, path, request_id)
      SELECT now() - CASE WHEN i <= ${old}::integer THEN interval '2 hours' ELSE interval '0' END, 'default', 'stale_fence', 'POST', '/p', 'r-' || i
      FROM generate_series(1, ${old + fresh}::integer) AS i`
    await t.db.sql`
      INSERT INTO fg_fence_history (at, tenant, entity, old_fence, new_fence, source)
      SELECT now() - CASE WHEN i <= ${old}::integer THEN interval '2 hours' ELSE interval '0' END, 'default', 'invoice:1', i - 1, i, 'command'
      FROM generate_series(1, ${old + fresh}::integer) AS i`
  }
  const count = async (table: 'fg_audit' | 'fg_fence_history') => {
    const [row] = table === 'fg_audit'
      ? await t.db.sql<{ n: number }>`SELECT count(*)::integer AS n FROM fg_audit`
      : await t.db.sql<{ n: number }>`SELECT count(*)::integer AS n FROM fg_fence_history`
    return Number(row!.n)
  }

  it('deletes rows past their retention in bounded batches, keeps the rest, and counts them in the metric', async () => {
    await seed(25, 4)
    const counted: Array<{ table: string; rows: number }> = []
    const metrics: Metrics = { ...noMetrics, rowsPurged: (e) => counted.push(e) }
    const config = retentions('1h', '1h')
    const first = await purgeOnce(t.store, config, metrics, { batch: 10, maxBatches: 2 })
    expect(first).toEqual({ idempotency: 0, audit: 20, fence_history: 20 })
    expect([await count('fg_audit'), await count('fg_fence_history')]).toEqual([9, 9])
    const second = await purgeOnce(t.store, config, metrics, { batch: 10, maxBatches: 2 })
    expect(second).toEqual({ idempotency: 0, audit: 5, fence_history: 5 })
    expect([await count('fg_audit'), await count('fg_fence_history')]).toEqual([4, 4])
    expect(await purgeOnce(t.store, config, metrics)).toEqual({ idempotency: 0, audit: 0, fence_history: 0 })
    expect(counted).toEqual([
      { table: 'audit', rows: 10 }, { table: 'audit', rows: 10 }, { table: 'fence_history', rows: 10 }, { table: 'fence_history', rows: 10 },
      { table: 'audit', rows: 5 }, { table: 'fence_history', rows: 5 },
    ])
  })

  it('keeps every row of a table without a retention', async () => {
    await seed(3, 1)
    expect(await purgeOnce(t.store, retentions(undefined, '1h'))).toEqual({ idempotency: 0, audit: 0, fence_history: 3 })
    expect(await count('fg_audit')).toBe(4)
    expect(await purgeOnce(t.store, retentions('1h'))).toEqual({ idempotency: 0, audit: 3, fence_history: 0 })
  })

  it('exposes the purged rows as fencegate_rows_purged_total by table', async () => {
    await seed(2, 0)
    const prom = createPromMetrics()
    await purgeOnce(t.store, retentions('1h', '1h'), prom)
    const text = await prom.render()
    expect(text).toContain('fencegate_rows_purged_total{table="audit"} 2')
    expect(text).toContain('fencegate_rows_purged_total{table="fence_history"} 2')
  })

  it.runIf(backend.name === 'postgres')('the Workers cron purges with the Worker\'s own bindings', async () => {
    await seed(2, 1)
    const config = JSON.stringify({ routes: [route('http://127.0.0.1:9')], audit: { retention: '1h' }, fence_history: { retention: '1h' } })
    await purgeRetainedOnWorkers({ FENCEGATE_CONFIG: config, DATABASE_URL: t.url })
    expect([await count('fg_audit'), await count('fg_fence_history')]).toEqual([1, 1])
  })
})
