import { describe, expect, it } from 'vitest'
import { StoreError } from '../src/store/db.js'
import { storeFailureHint } from '../src/store/failure-hints.js'
import { freePort } from './helpers/cluster.js'
import { runCli } from './helpers/process.js'

/** A store failure at start says what it most likely means, after its code. */
describe('storeFailureHint', () => {
  it.each([
    ['08P01', undefined, /PgBouncer refuses a session setting given in store\.url/],
    ['25006', undefined, /read-only.*target_session_attrs/],
    ['3D000', undefined, /database .* does not exist/],
    ['28P01', undefined, /password/],
    ['28000', undefined, /pg_hba/],
    ['42501', undefined, /may not create/],
    ['53300', undefined, /max_connections/],
    ['57P03', undefined, /starting up/],
    [undefined, 'ECONNREFUSED', /nothing listens/],
    [undefined, 'ENOTFOUND', /does not resolve/],
    [undefined, 'CONNECT_TIMEOUT', /store\.connect_timeout/],
  ])('%s %s', (sqlstate, driverCode, hint) => {
    expect(storeFailureHint(new StoreError(sqlstate, driverCode))).toMatch(hint)
  })

  it('has none for a code it cannot explain', () => {
    expect(storeFailureHint(new StoreError('40001', undefined))).toBeUndefined()
    expect(storeFailureHint(new StoreError(undefined, undefined))).toBeUndefined()
  })

  it('fencegate migrate names a store nothing listens at, after the code, and exits 1', async () => {
    const res = await runCli(['migrate', '--database-url', `postgres://postgres@127.0.0.1:${await freePort()}/fencegate`])
    expect(res.code).toBe(1)
    expect(res.stderr).toContain('store failure (ECONNREFUSED): nothing listens at the host and port of store.url')
  })

  it.skipIf(!process.env.DATABASE_URL)('fencegate migrate names a database that does not exist (on PostgreSQL)', async () => {
    const url = new URL(process.env.DATABASE_URL!)
    url.pathname = '/fencegate_no_such_database'
    const res = await runCli(['migrate', '--database-url', url.toString()])
    expect(res.code).toBe(1)
    expect(res.stderr).toContain('store failure (3D000): the database named in store.url does not exist')
  })
})
