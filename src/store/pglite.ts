import { PGlite, type Transaction } from '@electric-sql/pglite'
import { closeSync, mkdirSync, openSync, readFileSync, rmSync, writeSync } from 'node:fs'
import { join } from 'node:path'
import { passThrough, toNumbered, toParams, storeUnlisten, toStoreError, type Db, type SqlValue } from './db.js'

/**
 * A Db on embedded PGlite (PostgreSQL compiled to WebAssembly). With a data
 * directory it persists there and holds a lock file, because two processes
 * opening one PGlite directory would corrupt it; without one it is in memory.
 *
 * @example
 * const db = await openPglite('.fencegate')
 */
export async function openPglite(dataDir?: string): Promise<Db> {
  let release = () => {}
  if (dataDir) {
    mkdirSync(dataDir, { recursive: true })
    release = lockDataDir(dataDir)
  }
  try {
    return pgliteDb(await PGlite.create(dataDir ? { dataDir } : {}), release)
  } catch (err) {
    release()
    throw err
  }
}

/**
 * A Db on a PGlite instance you already have; closing the Db closes it.
 *
 * @example
 * const db = pgliteDb(await PGlite.create())
 */
export function pgliteDb(pg: PGlite, onClose: () => void = () => {}): Db {
  const db = wrap(pg, async () => {
    await pg.close()
    onClose()
  })
  return {
    ...db,
    // One session in this process: it never drops, so there is no reconnect to report.
    async listen(channel, onNotify) {
      try {
        return storeUnlisten(await pg.listen(channel, onNotify))
      } catch (err) {
        throw toStoreError(err)
      }
    },
  }
}

function wrap(pg: PGlite | Transaction, close: () => Promise<void>): Db {
  return {
    kind: 'pglite',
    async sql<T>(strings: TemplateStringsArray, ...values: SqlValue[]): Promise<T[]> {
      try {
        return (await pg.query<T>(toNumbered(strings), toParams(values))).rows
      } catch (err) {
        throw toStoreError(err)
      }
    },
    async exec(script) {
      try {
        await pg.exec(script)
      } catch (err) {
        throw toStoreError(err)
      }
    },
    async begin(fn) {
      if (!('transaction' in pg)) throw new Error('nested transactions are not used by fencegate')
      return passThrough((track) => pg.transaction((tx) => track(fn(wrap(tx, close)))))
    },
    close,
  }
}

/** Takes `<dir>/fencegate.pid`, refusing a directory held by a live process. */
function lockDataDir(dir: string): () => void {
  const file = join(dir, 'fencegate.pid')
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const fd = openSync(file, 'wx')
      writeSync(fd, String(process.pid))
      closeSync(fd)
      return () => rmSync(file, { force: true })
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err
      const holder = Number(readFileSync(file, 'utf8'))
      if (Number.isInteger(holder) && holder > 0 && (holder === process.pid || isAlive(holder))) {
        throw new Error(`the embedded store in ${dir} is in use by process ${holder}; stop it or read through its admin plane (--admin-url)`)
      }
      rmSync(file, { force: true })
    }
  }
  throw new Error(`could not lock the embedded store in ${dir}`)
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM'
  }
}
