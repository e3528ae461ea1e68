import postgres from 'postgres'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { readAuditPage } from '../src/admin/app.js'
import { StoreError } from '../src/store/db.js'
import { migrate, MigrationError } from '../src/store/migrate.js'
import { loadMigrations } from '../src/store/migrations-fs.js'
import type { Command, Rejection } from '../src/store/store.js'
import { backends, type TestDb } from './helpers/backends.js'

const command = (entity: string, fence: string, extra: Partial<Command> = {}): Command => ({
  tenant: 'default', route: 'capture', entity, fence, method: 'POST', path: `/p/${entity}`,
  bodySha256: 'ab'.repeat(32), caller: null, requestId: `req-${entity}-${fence}`, idempotency: null, ...extra,
})

const rejection = (code: string, extra: Partial<Rejection> = {}): Rejection => ({
  tenant: 'default', route: 'capture', entity: null, code, presentedFence: null, highestFence: null,
  method: 'POST', path: '/p', bodySha256: null, caller: null, requestId: `req-${code}`, ...extra,
})

describe.each(backends())('store on $name', (backend) => {
  let t: TestDb
  beforeEach(async () => {
    t = await backend.open()
  })
  afterEach(async () => {
    await t.close()
  })

  it('accepts the first fence, equal fences and higher fences, raising the highest', async () => {
    expect(await t.store.reserve(command('invoice:1', '5'))).toEqual({ kind: 'proceed', highest: '5' })
    expect(await t.store.reserve(command('invoice:1', '5'))).toEqual({ kind: 'proceed', highest: '5' })
    expect(await t.store.reserve(command('invoice:1', '9'))).toEqual({ kind: 'proceed', highest: '9' })
    expect((await t.store.getEntity('default', 'invoice:1'))?.highest_fence).toBe('9')
  })

  it('rejects a lower fence, keeps the highest and audits it in the same statement', async () => {
    await t.store.reserve(command('invoice:1', '9'))
    const before = await t.store.getEntity('default', 'invoice:1')
    expect(await t.store.reserve(command('invoice:1', '3'))).toEqual({ kind: 'stale', highest: '9' })
    const after = await t.store.getEntity('default', 'invoice:1')
    expect(after).toEqual(before)
    const [row] = await t.store.listAudit({ limit: 10 })
    expect(row).toMatchObject({
      code: 'stale_fence', entity: 'invoice:1', presented_fence: '3', highest_fence: '9',
      route: 'capture', tenant: 'default', method: 'POST', body_sha256: 'ab'.repeat(32), request_id: 'req-invoice:1-3',
    })
  })

  it('does not audit accepted fences', async () => {
    await t.store.reserve(command('invoice:1', '1'))
    await t.store.reserve(command('invoice:1', '2'))
    expect(await t.store.listAudit({ limit: 10 })).toEqual([])
  })

  it('handles the full bigint range', async () => {
    expect(await t.store.reserve(command('e', '9223372036854775807'))).toEqual({ kind: 'proceed', highest: '9223372036854775807' })
    expect(await t.store.reserve(command('e', '9223372036854775806'))).toEqual({ kind: 'stale', highest: '9223372036854775807' })
    expect(await t.store.reserve(command('e', '0'))).toEqual({ kind: 'stale', highest: '9223372036854775807' })
  })

  it('keeps fences apart per tenant and per entity', async () => {
    await t.store.reserve(command('invoice:1', '10', { tenant: 'a' }))
    expect(await t.store.reserve(command('invoice:1', '1', { tenant: 'b' }))).toEqual({ kind: 'proceed', highest: '1' })
    expect(await t.store.reserve(command('invoice:2', '1', { tenant: 'a' }))).toEqual({ kind: 'proceed', highest: '1' })
    expect(await t.store.getEntity('c', 'invoice:1')).toBeUndefined()
  })

  it('stamps updated_at with the database clock only when a fence raises the highest; an equal fence writes nothing', async () => {
    await t.store.reserve(command('e', '5', { requestId: 'first' }))
    const [{ now }] = await t.db.sql<{ now: string }>`SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD') AS now`
    const state = await t.store.getEntity('default', 'e')
    expect(state!.updated_at.slice(0, 10)).toBe(now)
    expect(state!.updated_at).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$/)
    await t.db.sql`UPDATE fg_fences SET updated_at = '2000-01-01T00:00:00Z'`
    const [{ version }] = await t.db.sql<{ version: string }>`SELECT xmin::text AS version FROM fg_fences WHERE entity = 'e'`
    expect(await t.store.reserve(command('e', '4', { requestId: 'stale' }))).toEqual({ kind: 'stale', highest: '5' })
    expect(await t.store.reserve(command('e', '5', { requestId: 'equal' }))).toEqual({ kind: 'proceed', highest: '5' })
    expect(await t.store.getEntity('default', 'e')).toMatchObject({ updated_at: '2000-01-01T00:00:00.000000Z', request_id: 'first' })
    // Not even a new row version: the stale and the equal fence were decided by a read.
    expect((await t.db.sql<{ version: string }>`SELECT xmin::text AS version FROM fg_fences WHERE entity = 'e'`)[0]!.version).toBe(version)
    await t.store.reserve(command('e', '6', { requestId: 'raise' }))
    const raised = await t.store.getEntity('default', 'e')
    expect(raised!.updated_at.slice(0, 10)).toBe(now)
    expect(raised!.request_id).toBe('raise')
  })

  it('records rejections and filters the audit trail by every field', async () => {
    await t.store.recordRejection(rejection('invalid_fence', { route: 'a' }))
    await t.store.recordRejection(rejection('fence_required', { route: 'b', tenant: 'other' }))
    await t.store.recordRejection(rejection('entity_unresolved', { route: 'a', entity: 'x:1', presentedFence: '4' }))
    const codes = async (q: Parameters<typeof t.store.listAudit>[0]) => (await t.store.listAudit(q)).map((r) => r.code)
    expect(await codes({ limit: 10 })).toEqual(['entity_unresolved', 'fence_required', 'invalid_fence'])
    expect(await codes({ limit: 10, route: 'a' })).toEqual(['entity_unresolved', 'invalid_fence'])
    expect(await codes({ limit: 10, tenant: 'other' })).toEqual(['fence_required'])
    expect(await codes({ limit: 10, entity: 'x:1' })).toEqual(['entity_unresolved'])
    expect(await codes({ limit: 10, code: 'invalid_fence' })).toEqual(['invalid_fence'])
    expect(await codes({ limit: 10, sinceMs: 3_600_000 })).toHaveLength(3)
    expect(await codes({ limit: 10, untilMs: 3_600_000 })).toEqual([])
    await t.db.sql`UPDATE fg_audit SET at = '2001-01-01T00:00:00Z' WHERE code = 'invalid_fence'`
    expect(await codes({ limit: 10, sinceMs: 3_600_000 })).toEqual(['entity_unresolved', 'fence_required'])
    expect(await codes({ limit: 10, until: '2002-01-01T00:00:00Z' })).toEqual(['invalid_fence'])
    expect(await codes({ limit: 10, since: '2002-01-01T00:00:00Z' })).toEqual(['entity_unresolved', 'fence_required'])
  })

  it('pages the audit trail newest first with a keyset cursor that neither skips nor repeats', async () => {
    for (let i = 0; i < 7; i++) await t.store.recordRejection(rejection('invalid_fence', { requestId: `r${i}` }))
    const seen: string[] = []
    let cursor: string | undefined
    let pages = 0
    do {
      const page = await readAuditPage(t.store, { limit: 3, ...(cursor ? { before: cursor } : {}) })
      seen.push(...page.items.map((i) => i.request_id))
      cursor = page.next_cursor ?? undefined
      pages++
    } while (cursor && pages < 10)
    expect(seen).toEqual(['r6', 'r5', 'r4', 'r3', 'r2', 'r1', 'r0'])
    expect(pages).toBe(3)
  })

  it('applies each migration once, also when several instances migrate at the same time', async () => {
    const results = await Promise.all([1, 2, 3].map(() => migrate(t.db, loadMigrations())))
    expect(results.flatMap((r) => r.applied)).toEqual([])
    const rows = await t.db.sql<{ id: number }>`SELECT id FROM fg_migrations ORDER BY id`
    expect(rows.map((r) => r.id)).toEqual(loadMigrations().map((m) => m.id))
  })

  it('refuses a database migrated by a newer version', async () => {
    await t.db.sql`INSERT INTO fg_migrations (id, name) VALUES (9999, 'from_the_future')`
    await expect(migrate(t.db, loadMigrations())).rejects.toThrow(MigrationError)
    await expect(migrate(t.db, loadMigrations())).rejects.toThrow(/newer than this fencegate knows/)
  })

  it('rolls back a failing migration completely and reports its SQLSTATE only', async () => {
    const current = loadMigrations()
    const broken = { id: 9000, name: 'broken', sql: 'CREATE TABLE fg_half (x int); SELECT 1/0;' }
    const err = await migrate(t.db, [...current, broken]).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(StoreError)
    expect((err as StoreError).sqlstate).toBe('22012')
    const tables = await t.db.sql`SELECT 1 FROM information_schema.tables WHERE table_name = 'fg_half'`
    expect(tables).toEqual([])
    const [{ max }] = await t.db.sql<{ max: number }>`SELECT max(id)::int AS max FROM fg_migrations`
    expect(max).toBe(current.at(-1)!.id)
  })

  it.runIf(backend.name === 'postgres')('a key that is not lease-bound never touches the job table: the lease check is a function only lease routes call', async () => {
    const other = postgres(t.url!, { max: 1, onnotice: () => {} })
    try {
      await other.begin(async (tx) => {
        await tx`LOCK TABLE fg_jobs IN ACCESS EXCLUSIVE MODE`
        // With fg_jobs in its plan, reserve would wait for this lock, which is held until it answers.
        const keyed = command('invoice:1', '5', {
          idempotency: { key: 'k', fingerprint: 'f', ownerToken: 'o', lockMs: 30_000, ttlMs: 60_000, retryUnknown: false },
        })
        expect(await t.store.reserve(keyed)).toMatchObject({ kind: 'proceed' })
      })
    } finally {
      await other.end()
    }
  })

  it('turns a store that went away into a StoreError', async () => {
    await t.breakStore()
    await expect(t.store.reserve(command('e', '1'))).rejects.toBeInstanceOf(StoreError)
    await expect(t.store.ping()).rejects.toBeInstanceOf(StoreError)
  })
})
