import type { Db } from './db.js'

/** One numbered schema change, e.g. `0001_init.sql`. */
export interface Migration {
  id: number
  name: string
  sql: string
}

export class MigrationError extends Error {
  override name = 'MigrationError'
}

// An arbitrary constant ("fence" in ASCII) that every fencegate instance locks on.
const migrationLock = '435761784165'

/**
 * Applies pending migrations, each once and in its own transaction, under a
 * transaction-scoped advisory lock, so several instances starting together
 * apply each migration exactly once. Refuses a database that is ahead.
 *
 * @example
 * await migrate(db, await loadMigrations())
 */
export async function migrate(db: Db, migrations: Migration[]): Promise<{ applied: Migration[]; current: number }> {
  const sorted = [...migrations].sort((a, b) => a.id - b.id)
  const latest = sorted.at(-1)?.id ?? 0
  const applied: Migration[] = []
  for (;;) {
    const step = await db.begin(async (tx) => {
      await tx.sql`SELECT pg_advisory_xact_lock(${migrationLock}::bigint)`
      await tx.exec(`CREATE TABLE IF NOT EXISTS fg_migrations (
        id integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)
      const [row] = await tx.sql<{ current: number }>`SELECT coalesce(max(id), 0)::int AS current FROM fg_migrations`
      const current = row!.current
      if (current > latest) {
        throw new MigrationError(`the database is at migration ${current}, newer than this fencegate knows (${latest}); upgrade fencegate`)
      }
      const next = sorted.find((m) => m.id > current)
      if (!next) return { current }
      await tx.exec(next.sql)
      await tx.sql`INSERT INTO fg_migrations (id, name) VALUES (${next.id}, ${next.name})`
      return { current: next.id, next }
    })
    if (!step.next) return { applied, current: step.current }
    applied.push(step.next)
  }
}

/** Parses `0001_init.sql`-style file names; anything else is a mistake worth failing on. */
export function migrationFromFile(fileName: string, sql: string): Migration {
  const m = /^(\d{4})_([a-z0-9_]+)\.sql$/.exec(fileName)
  if (!m) throw new MigrationError(`migration file ${fileName} must be named NNNN_name.sql`)
  return { id: Number(m[1]), name: m[2]!, sql }
}

/**
 * The highest migration applied to the database, in one statement (readiness asks it on every
 * probe). Rejects when the store cannot be reached, or has no fencegate schema yet.
 *
 * @example
 * const atHead = (await appliedMigration(db)) >= latestMigration(loadMigrations())
 */
export async function appliedMigration(db: Pick<Db, 'sql'>): Promise<number> {
  const [row] = await db.sql<{ current: number }>`SELECT coalesce(max(id), 0)::int AS current FROM fg_migrations`
  return row!.current
}

/** The newest migration of a set: the schema a gateway built with it needs. */
export function latestMigration(migrations: Migration[]): number {
  return migrations.reduce((max, m) => Math.max(max, m.id), 0)
}
