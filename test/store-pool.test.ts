import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import { describe, expect, it } from 'vitest'
import { parseConfig } from '../src/config/schema.js'
import { silentLogger } from '../src/observe/log.js'
import { startGateway } from '../src/runtime/node/gateway.js'
import { backends } from './helpers/backends.js'
import { route } from './helpers/gateway.js'
import { startUpstream } from './helpers/upstream.js'

// store.max_connections bounds the gateway's PostgreSQL connections: under 40 concurrent
// fenced commands, the statements queue on (and pipeline over) that many, and none fails.
// Without DATABASE_URL the suite is skipped, not left undefined: a file that defines no
// suite fails the whole run ("No test suite found in file").
const postgresBackend = backends().find((b) => b.name === 'postgres')

describe.skipIf(!postgresBackend)('store.max_connections on PostgreSQL', () => {
  it('opens no more statement connections than configured, however many commands are in flight', async () => {
    const t = await postgresBackend!.open()
    const upstream = await startUpstream()
    const config = parseConfig({
      server: { port: 0, admin_port: 0 }, store: { data_dir: mkdtempSync(join(tmpdir(), 'fencegate-pool-')), max_connections: 2 },
      log: { level: 'silent' }, routes: [route(upstream.url)],
    })
    const gw = await startGateway({ config, databaseUrl: t.url!, log: silentLogger })
    const admin = postgres(t.url!, { max: 1, onnotice: () => {}, connection: { application_name: 'pool-test' } })
    try {
      const answers = await Promise.all(Array.from({ length: 40 }, (_, i) => fetch(`${gw.dataUrl}/payments/${i}/capture`, {
        method: 'POST', headers: { 'x-execution-fence': '1', 'content-type': 'application/json' }, body: '{}',
      }).then((res) => res.status)))
      expect(answers).toEqual(Array.from({ length: 40 }, () => 200))
      // The rule registry's LISTEN has a connection of its own; it runs no statements.
      const backendsOpen = await admin<{ listening: boolean }[]>`
        SELECT query ILIKE 'listen%' AS listening FROM pg_stat_activity
        WHERE datname = current_database() AND application_name = 'fencegate'`
      expect(backendsOpen.filter((b) => !b.listening).length).toBe(2)
      expect(backendsOpen.length).toBeLessThanOrEqual(3)
    } finally {
      await admin.end()
      await gw.close()
      await upstream.close()
      await t.close()
    }
  })
})
