import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { mayHaveReserved } from '../src/gateway/abandoned.js'
import { createLogger } from '../src/observe/log.js'
import { StoreError, type Db } from '../src/store/db.js'
import { DurabilityRefusal } from '../src/store/durability.js'
import { connectPostgres } from '../src/store/postgres.js'
import { createStore } from '../src/store/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startKeyCountingUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * A TCP relay to PostgreSQL that can lose one answer: once the client sends a message
 * containing `marker` (a statement's parameter), the server's next bytes on that connection
 * are swallowed and both ends closed, so the statement committed and its answer never came,
 * as when a primary dies or a network drops between the commit and its reply. While `down`,
 * new connections are closed at once.
 */
async function startAnswerDropper(targetPort: number) {
  let marker: Buffer | undefined
  let downAfterDrop = false
  let down = false
  const sockets = new Set<Socket>()
  const server: Server = createServer((client) => {
    if (down) return void client.destroy()
    const target = connect(targetPort, '127.0.0.1')
    sockets.add(client).add(target)
    let armed = false
    client.on('data', (chunk: Buffer) => {
      if (marker && chunk.includes(marker)) {
        armed = true
        marker = undefined
      }
      target.write(chunk)
    })
    target.on('data', (chunk: Buffer) => {
      if (!armed) return void client.write(chunk)
      client.destroy()
      target.destroy()
      if (downAfterDrop) setDown(true)
    })
    for (const s of [client, target]) {
      s.on('error', () => {})
      s.on('close', () => {
        client.destroy()
        target.destroy()
      })
    }
  })
  const setDown = (value: boolean) => {
    down = value
    if (value) for (const s of sockets) s.destroy()
  }
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    port: (server.address() as AddressInfo).port,
    /** Loses the answer to the next statement sent with `text`; with `thenDown`, the relay then goes down. */
    dropAnswerTo(text: string, thenDown = false) {
      marker = Buffer.from(text)
      downAfterDrop = thenDown
    },
    setDown,
    close: () => new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy()
      server.close(() => resolve())
    }),
  }
}

const pg = backends().find((b) => b.name === 'postgres')

describe.skipIf(!pg)('a reservation whose answer was lost frees its key (PostgreSQL)', () => {
  let t: TestDb
  let db: Db
  let relay: Awaited<ReturnType<typeof startAnswerDropper>>
  let upstream: TestUpstream & { executions: Map<string, number> }
  let gw: TestGateway
  let released: Promise<void>

  beforeEach(async () => {
    t = await pg!.open()
    relay = await startAnswerDropper(Number(new URL(t.url!).port || 5432))
    const url = new URL(t.url!)
    url.hostname = '127.0.0.1'
    url.port = String(relay.port)
    db = connectPostgres(url.toString(), { max: 2 })
    upstream = await startKeyCountingUpstream()
    let onReleased = () => {}
    released = new Promise((resolve) => (onReleased = resolve))
    const log = createLogger('debug', (line) => {
      if ((JSON.parse(line) as { event: string }).event === 'abandoned_key_released') onReleased()
    })
    // idempotency_wait 0: a duplicate of a key still in flight is refused at once (409) instead of waiting.
    const config = testConfig([route(upstream.url, { idempotency: 'required', idempotency_wait: '0s', idempotency_lock: '60s' })])
    gw = await startTestGateway({ config, store: createStore(db, { schedule: setImmediate }), log })
  })
  afterEach(async () => {
    await gw.close()
    await db.close()
    await relay.close()
    await upstream.close()
    await t.close()
  })

  it('a retry of a command whose reservation answer was lost is forwarded, not refused as in progress until the lock expires', async () => {
    relay.dropAnswerTo('lost-answer-1')
    const first = await post(`${gw.url}/payments/7/capture`, '3', { headers: { 'idempotency-key': 'lost-answer-1' } })
    expect(first.status).toBe(503)
    expect(first.json.code).toBe('store_unavailable')
    // The reservation did commit: the fence was taken, though nothing was forwarded.
    const [row] = await t.db.sql<{ fence: string }>`SELECT highest_fence::text AS fence FROM fg_fences WHERE entity = 'invoice:7'`
    expect(row?.fence).toBe('3')
    expect(upstream.received).toHaveLength(0)

    const retry = await post(`${gw.url}/payments/7/capture`, '3', { headers: { 'idempotency-key': 'lost-answer-1' } })
    // Before the fix: 409 request_in_progress for every retry until idempotency_lock (60 s) expired.
    expect(retry.status).toBe(200)
    expect(upstream.executions.get('lost-answer-1')).toBe(1)
  })

  it('releases the key once the store answers again when it could not at once', async () => {
    // The answer is lost and the store stays unreachable: the release tried before the 503 fails too.
    relay.dropAnswerTo('lost-answer-2', true)
    const first = await post(`${gw.url}/payments/8/capture`, '1', { headers: { 'idempotency-key': 'lost-answer-2' } })
    expect(first.status).toBe(503)
    relay.setDown(false)
    // The retries in the background release it once the store answers.
    await released
    const retry = await post(`${gw.url}/payments/8/capture`, '1', { headers: { 'idempotency-key': 'lost-answer-2' } })
    expect(retry.status).toBe(200)
    expect(upstream.executions.get('lost-answer-2')).toBe(1)
  })
})

describe('which failed reservations may hold their key', () => {
  const lost = () => new StoreError(undefined, 'CONNECTION_CLOSED')
  it.each([
    ['a connection lost after sending', lost(), true],
    ['a connection lost before sending', Object.assign(lost(), { unsent: true }), false],
    ['SQLSTATE 57P01 (terminated backend)', new StoreError('57P01', undefined), true],
    ['SQLSTATE 08006 (connection failure)', new StoreError('08006', undefined), true],
    ['a statement a live connection refused (40001)', new StoreError('40001', undefined), false],
    ['a durability refusal before the statement ran', new DurabilityRefusal('store_not_replicated', 'x'), false],
    ['a durability refusal after it ran', new DurabilityRefusal('store_lost_commits', 'x', true), true],
    ['anything else', new Error('x'), false],
  ])('%s', (_, err, expected) => {
    expect(mayHaveReserved(err)).toBe(expected)
  })
})
