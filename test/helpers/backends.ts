import postgres from 'postgres'
import { inject } from 'vitest'
import { StoreError, type Db } from '../../src/store/db.js'
import { migrate } from '../../src/store/migrate.js'
import { loadMigrations } from '../../src/store/migrations-fs.js'
import { PGlite } from '@electric-sql/pglite'
import { pgliteDb } from '../../src/store/pglite.js'
import { connectPostgres } from '../../src/store/postgres.js'
import { createStore, type Store } from '../../src/store/store.js'
import { withDatabase } from './global-setup.js'

/** A fresh, migrated database and the Store on it. */
export interface TestDb {
  db: Db
  store: Store
  /** The PostgreSQL URL, for tests that start gateway processes (undefined on PGlite). */
  url: string | undefined
  /** Runs SQL as the test, outside the Store (to inspect or to install test triggers). */
  close(): Promise<void>
  /** Makes the store unreachable: drops the database (PostgreSQL) or closes PGlite. */
  breakStore(): Promise<void>
}

export interface Backend {
  name: 'pglite' | 'postgres'
  open(): Promise<TestDb>
}

let counter = 0

// Starting PGlite costs a second or more; each test gets a clone of one migrated instance instead.
let pgliteTemplate: Promise<PGlite> | undefined
async function migratedPglite(): Promise<PGlite> {
  const pg = await PGlite.create()
  await migrate(pgliteDb(pg), loadMigrations())
  return pg
}

// A clone costs a second of CPU; a closed test's instance is wiped and migrated again
// instead (tens of milliseconds), so a worker process clones only a handful.
const idle: PGlite[] = []

/** Makes a used instance as new: no tables, functions, triggers or listens of the last test left. */
async function recycle(pg: PGlite): Promise<void> {
  if (pg.closed) return
  try {
    await pg.exec('ROLLBACK; UNLISTEN *; DROP SCHEMA public CASCADE; CREATE SCHEMA public;')
    await migrate(pgliteDb(pg), loadMigrations())
    idle.push(pg)
  } catch {
    await pg.close().catch(() => {})
  }
}

function guarded(db: Db, isClosed: () => boolean): Db {
  const refuse = () => Promise.reject(new StoreError('08003', undefined))
  return {
    ...db,
    sql: (strings, ...values) => (isClosed() ? refuse() : db.sql(strings, ...values)),
    exec: (script) => (isClosed() ? refuse() : db.exec(script)),
    begin: (fn) => (isClosed() ? refuse() : db.begin(fn)),
    ...(db.listen ? { listen: (channel: string, onNotify: (payload: string) => void) => (isClosed() ? refuse() : db.listen!(channel, onNotify)) } : {}),
  }
}

const pglite: Backend = {
  name: 'pglite',
  async open() {
    pgliteTemplate ??= migratedPglite()
    const pg = idle.pop() ?? ((await (await pgliteTemplate).clone()) as PGlite)
    let closed = false
    // Once closed, this test's Db fails as a closed one would: a late statement of this
    // test must never reach the next test that gets the instance.
    const db = guarded(pgliteDb(pg), () => closed)
    return {
      db,
      store: createStore(db, { schedule: setImmediate }),
      url: undefined,
      async close() {
        if (!closed) await recycle(pg)
        closed = true
      },
      async breakStore() {
        if (!closed) await db.close()
        closed = true
      },
    }
  },
}

function postgresBackend(adminUrl: string, template: string): Backend {
  return {
    name: 'postgres',
    async open() {
      const name = `${template}_${process.pid}_${++counter}`
      const admin = postgres(adminUrl, { max: 1, onnotice: () => {} })
      try {
        for (let attempt = 0; ; attempt++) {
          try {
            await admin.unsafe(`CREATE DATABASE ${name} TEMPLATE ${template}`)
            break
          } catch (err) {
            // 55006 object_in_use: another file is copying the template right now.
            if ((err as { code?: string }).code !== '55006' || attempt > 50) throw err
            await new Promise((r) => setTimeout(r, 50 + Math.random() * 100))
          }
        }
      } finally {
        await admin.end()
      }
      const url = withDatabase(adminUrl, name)
      const db = connectPostgres(url)
      let closed = false
      const close = async () => {
        if (!closed) await db.close()
        closed = true
      }
      return {
        db,
        store: createStore(db, { schedule: setImmediate }),
        url,
        close,
        async breakStore() {
          const a = postgres(adminUrl, { max: 1, onnotice: () => {} })
          await a.unsafe(`DROP DATABASE ${name} WITH (FORCE)`)
          await a.end()
        },
      }
    },
  }
}

/** PGlite always; PostgreSQL too when DATABASE_URL is set (CI sets it). */
export function backends(): Backend[] {
  const pg = inject('pgTemplate')
  return pg ? [pglite, postgresBackend(pg.adminUrl, pg.template)] : [pglite]
}
