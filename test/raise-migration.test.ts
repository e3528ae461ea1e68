import { describe, expect, it } from 'vitest'
import { migrate } from '../src/store/migrate.js'
import { loadMigrations } from '../src/store/migrations-fs.js'
import { backends } from './helpers/backends.js'

// Migration 0017 changes two columns' types (history source to an enum, highest_fence to a
// domain): the rows written before it keep their values, the checks still refuse what the
// CHECKs refused, and fg_present_fence keeps the one signature 0016 gave it.
describe.each(backends())('migration 0017 on $name', (backend) => {
  it('applies on a database at 0016 with history, keeps every row and still refuses a negative fence and an unknown source', async () => {
    const t = await backend.open()
    try {
      await t.db.exec('DROP SCHEMA public CASCADE; CREATE SCHEMA public;')
      const all = loadMigrations()
      await migrate(t.db, all.filter((m) => m.id <= 16))
      const present = (fence: number) =>
        t.db.sql`SELECT fg_present_fence('acme', 'capture', 'invoice:1', ${fence}::bigint, 'POST', '/p', NULL, 'w', ${`r${fence}`})`
      await present(5)
      await present(7)
      await t.store.bumpFence({ tenant: 'acme', entity: 'invoice:1', minFence: '9', caller: 'oncall', requestId: 'bump' })
      expect((await migrate(t.db, all.filter((m) => m.id <= 17))).applied.map((m) => m.id)).toEqual([17])
      await present(11)
      const changes = (await t.store.listFenceHistory({ tenant: 'acme', entity: 'invoice:1', limit: 10 })).reverse()
      expect(changes.map((c) => [c.old_fence, c.new_fence, c.source])).toEqual([[null, '5', 'command'], ['5', '7', 'command'], ['7', '9', 'bump'], ['9', '11', 'command']])
      const [fns] = await t.db.sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_proc WHERE proname = 'fg_present_fence'`
      expect(fns!.n).toBe(1)
      const refused = async (run: () => Promise<unknown>) => run().then(() => 'accepted', (err: { sqlstate?: string }) => err.sqlstate)
      expect(await refused(() => t.db.sql`UPDATE fg_fences SET highest_fence = -1 WHERE tenant = 'acme'`)).toBe('23514')
      expect(await refused(() => t.db.sql`
        INSERT INTO fg_fence_history (tenant, entity, new_fence, source) VALUES ('acme', 'invoice:1', 1, 'manual')`)).toBe('22P02')
    } finally {
      await t.close()
    }
  // Three migration runs from an empty schema (open's, to 16, to 17): minutes on a loaded PGlite.
  }, 180_000)
})
