import { readdirSync, readFileSync, existsSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { migrationFromFile, type Migration } from './migrate.js'

/** The package root: the nearest folder above this file that holds `migrations/`. */
export function packageRoot(from = dirname(fileURLToPath(import.meta.url))): string {
  for (let dir = from; ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'migrations')) && existsSync(join(dir, 'package.json'))) return dir
    if (dirname(dir) === dir) throw new Error('cannot find the fencegate package root (migrations/ is missing)')
  }
}

/** Reads the numbered SQL files shipped in `migrations/`. */
export function loadMigrations(dir = join(packageRoot(), 'migrations')): Migration[] {
  return readdirSync(dir)
    .filter((f) => f.endsWith('.sql'))
    .sort()
    .map((f) => migrationFromFile(f, readFileSync(join(dir, f), 'utf8')))
}
