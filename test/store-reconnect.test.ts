import { createServer, type AddressInfo } from 'node:net'
import postgres from 'postgres'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { StoreError, storeCode, type Db } from '../src/store/db.js'
import { connectPostgres } from '../src/store/postgres.js'
import { failedBeforeSending } from '../src/store/postgres-pool.js'
import { backends, type TestDb } from './helpers/backends.js'

/**
 * What the store layer does with a PostgreSQL connection that was killed under a statement,
 * on a pool of one connection so the statement after the kill must use its replacement.
 * PostgreSQL only: PGlite has no connections to lose.
 */
const pg = backends().find((b) => b.name === 'postgres')

describe.skipIf(!pg)('a connection terminated under a statement (PostgreSQL)', () => {
  let t: TestDb
  let db: Db
  let admin: postgres.Sql

  beforeEach(async () => {
    t = await pg!.open()
    db = connectPostgres(t.url!, { max: 1 })
    admin = postgres(t.url!, { max: 1, onnotice: () => {}, fetch_types: false })
  })
  afterEach(async () => {
    await db.close()
    await admin.end()
    await t.close()
  })

  /** Starts `SELECT pg_sleep(60)` with a counted side effect, and terminates its backend once it runs. */
  async function killedStatement() {
    await db.exec('CREATE SEQUENCE ran')
    const [{ pid }] = await db.sql<{ pid: number }>`SELECT pg_backend_pid() AS pid`
    const sleeping = db.sql`SELECT nextval('ran'), pg_sleep(60)`
    const outcome = sleeping.then(() => 'answered', storeCode)
    // Polls the server's view until the statement runs there (no fixed sleep).
    while ((await admin`SELECT 1 FROM pg_stat_activity WHERE pid = ${pid} AND query LIKE '%pg_sleep%' AND state = 'active'`).length === 0) {
      await new Promise((r) => setImmediate(r))
    }
    await admin`SELECT pg_terminate_backend(${pid})`
    return outcome
  }

  it('serves the next statement instead of replaying the dead backend\'s 57P01 onto it', async () => {
    expect(await killedStatement()).toBe('CONNECTION_CLOSED')
    // postgres.js 3.4.9 failed this one with the killed backend's 57P01 (issue 12, defect 4).
    expect(await db.sql<{ one: number }>`SELECT 1 AS one`).toEqual([{ one: 1 }])
  })

  it('never retries a statement that was cut off after it was sent', async () => {
    expect(await killedStatement()).toBe('CONNECTION_CLOSED')
    const [{ n }] = await db.sql<{ n: string }>`SELECT last_value::text AS n FROM ran`
    expect(n).toBe('1')
  })
})

describe('failedBeforeSending reads postgres.js\'s own mark of a written statement', () => {
  it('is true for a statement whose connection could not be opened', async () => {
    // Port 1 is never a PostgreSQL server; the connection is refused before anything is sent.
    const sql = postgres('postgres://nobody@127.0.0.1:1/none', { max: 1, connect_timeout: 1, fetch_types: false })
    const query = sql`SELECT 1`
    await expect(query).rejects.toMatchObject({ code: 'ECONNREFUSED' })
    expect(failedBeforeSending(query)).toBe(true)
    await sql.end({ timeout: 0 })
  })

  it.skipIf(!pg)('is false for a statement the driver wrote to a connection', async () => {
    const t = await pg!.open()
    const sql = postgres(t.url!, { max: 1, fetch_types: false })
    try {
      const query = sql`SELECT 1/0`
      await expect(query).rejects.toMatchObject({ code: '22012' })
      expect(failedBeforeSending(query)).toBe(false)
    } finally {
      await sql.end()
      await t.close()
    }
  })
})

describe('a server that accepts connections and closes them at once', () => {
  it('fails a statement as never sent instead of reconnecting under it forever', async () => {
    let accepted = 0
    const server = createServer((socket) => {
      accepted++
      socket.destroy()
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    const db = connectPostgres(`postgres://postgres@127.0.0.1:${(server.address() as AddressInfo).port}/test`, { max: 2 })
    try {
      // postgres.js kept the statement and reconnected with no bound (each close during startup
      // restarted the connection): this waited forever, one TCP connection after another.
      const err = await db.sql`SELECT 1`.then(() => undefined, (e: unknown) => e as StoreError)
      expect(err).toBeInstanceOf(StoreError)
      expect(err?.driverCode).toBe('ECONNRESET')
      expect(err?.unsent).toBe(true)
      // The connection it was given, and the one retry of a statement never sent.
      expect(accepted).toBeLessThanOrEqual(2)
    } finally {
      await db.close()
      await new Promise((resolve) => server.close(resolve))
    }
  })
})
