import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import type { TestProject } from 'vitest/node'
import { migrate } from '../../src/store/migrate.js'
import { loadMigrations } from '../../src/store/migrations-fs.js'
import { connectPostgres } from '../../src/store/postgres.js'

declare module 'vitest' {
  export interface ProvidedContext {
    /** A migrated PostgreSQL database that each test copies, or null without DATABASE_URL. */
    pgTemplate: { adminUrl: string; template: string } | null
  }
}

/**
 * With DATABASE_URL set, makes one migrated template database for this run;
 * every test database is a fresh copy of it, dropped at the end of the run.
 */
export default async function setup(project: TestProject) {
  // The run's temporary directories live under one, removed at the end (helpers/process.ts
  // tempDir; the test processes inherit the variable when they are forked).
  const tmpRoot = mkdtempSync(join(tmpdir(), 'fencegate-run-'))
  process.env.FENCEGATE_TEST_TMP = tmpRoot
  const removeTmp = () => rmSync(tmpRoot, { recursive: true, force: true })
  const adminUrl = process.env.DATABASE_URL
  if (!adminUrl) {
    console.warn('DATABASE_URL is not set: store tests run on PGlite only')
    project.provide('pgTemplate', null)
    return removeTmp
  }
  const template = `fencegate_t${Date.now().toString(36)}${process.pid}`
  const admin = postgres(adminUrl, { max: 1, onnotice: () => {} })
  await admin.unsafe(`CREATE DATABASE ${template}`)
  const db = connectPostgres(withDatabase(adminUrl, template), { max: 1 })
  await migrate(db, loadMigrations())
  await db.close()
  project.provide('pgTemplate', { adminUrl, template })
  return async () => {
    const dbs = await admin<{ datname: string }[]>`SELECT datname FROM pg_database WHERE datname LIKE ${template + '%'}`
    for (const { datname } of dbs) await admin.unsafe(`DROP DATABASE IF EXISTS ${datname} WITH (FORCE)`)
    await admin.end()
    removeTmp()
  }
}

export function withDatabase(url: string, database: string): string {
  const u = new URL(url)
  u.pathname = `/${database}`
  return u.toString()
}
