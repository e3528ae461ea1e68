import { openDb } from '../runtime/node/gateway.js'
import { storeLocation, type Flags } from './usage.js'

/** `fencegate migrate`: applies pending migrations (the same step `serve` runs at start). */
export async function runMigrate(flags: Flags): Promise<number> {
  const { url, dataDir } = storeLocation(flags, process.env)
  const db = await openDb(url, dataDir)
  await db.close()
  console.log(`migrated ${url ? 'the PostgreSQL database' : `the embedded store in ${dataDir}`}`)
  return 0
}
