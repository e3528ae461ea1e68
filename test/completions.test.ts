import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { StoreError, type Db } from '../src/store/db.js'
import { createStore, type Command, type Held, type Store } from '../src/store/store.js'
import { backends, type TestDb } from './helpers/backends.js'
import { counting } from './helpers/counting.js'

const command = (key: string, owner: string): Command => ({
  tenant: 'default', route: 'capture', entity: `invoice:${key}`, fence: '1', method: 'POST', path: `/p/${key}`,
  bodySha256: 'ab'.repeat(32), caller: null, requestId: `req-${key}-${owner}`,
  idempotency: { key, fingerprint: `fp-${key}`, ownerToken: owner, lockMs: 30_000, ttlMs: 60_000, retryUnknown: false },
})

const held = (key: string, owner = `owner-${key}`): Held => ({ tenant: 'default', key, ownerToken: owner })
const bytes = (text: string) => new TextEncoder().encode(text)
const response = (status: number, body: string) => ({
  status, headers: [['content-type', 'text/plain'], ['x-key', body]] as [string, string][], body: bytes(body),
})

describe.each(backends())('batched completions on $name', (backend) => {
  let t: TestDb
  let db: Db & { count: number }
  let store: Store
  beforeEach(async () => {
    t = await backend.open()
    db = counting(t.db)
    // As the Node gateway wires it: completions of one event-loop turn share a statement.
    store = createStore(db, { schedule: setImmediate })
  })
  afterEach(async () => {
    await t.close()
  })

  const reserveAll = async (keys: string[]) => {
    for (const key of keys) expect(await store.reserve(command(key, `owner-${key}`))).toMatchObject({ kind: 'proceed' })
  }
  const replayOf = (key: string) => store.reserve(command(key, 'someone-else'))

  it('writes the completions of one turn in one statement, each record with its own response', async () => {
    const keys = Array.from({ length: 30 }, (_, i) => `k${i}`)
    await reserveAll(keys)
    const before = db.count
    // Bodies of different lengths (one empty), so a wrong slice of the shared byte string shows.
    const applied = await Promise.all(keys.map((key, i) =>
      store.complete(held(key), { replayable: true, response: response(200 + i, key.repeat(i)), ttlMs: 60_000 })))
    expect(applied).toEqual(keys.map(() => true))
    expect(db.count - before).toBe(1)
    for (const [i, key] of keys.entries()) {
      const replay = await replayOf(key)
      if (replay.kind !== 'replay') throw new Error(`expected a replay of ${key}, got ${replay.kind}`)
      const { status, headers, body } = replay.stored
      expect({ status, headers, body: new TextDecoder().decode(body) })
        .toEqual({ status: 200 + i, headers: [['content-type', 'text/plain'], ['x-key', key.repeat(i)]], body: key.repeat(i) })
    }
  })

  it('applies each completion only for its owner: a batch mixes applied and refused ones', async () => {
    await reserveAll(['mine', 'theirs', 'big'])
    const [mine, theirs, big] = await Promise.all([
      store.complete(held('mine'), { replayable: true, response: response(201, 'created'), ttlMs: 60_000 }),
      store.complete(held('theirs', 'not-the-owner'), { replayable: true, response: response(200, 'no'), ttlMs: 60_000 }),
      store.complete(held('big'), { replayable: false, response: response(200, 'too large to keep'), ttlMs: 60_000 }),
    ])
    expect([mine, theirs, big]).toEqual([true, false, true])
    expect((await t.store.getKey('default', 'mine'))?.state).toBe('completed')
    expect((await t.store.getKey('default', 'theirs'))?.state).toBe('in_flight')
    expect(await t.store.getKey('default', 'big')).toMatchObject({ state: 'not_replayable', status: 200 })
    expect(await replayOf('big')).toEqual({ kind: 'not_replayable' })
    // A record completes once: a second completion by the same owner no longer applies.
    expect(await store.complete(held('mine'), { replayable: true, response: response(500, 'again'), ttlMs: 60_000 })).toBe(false)
  })

  it('one completion whose row the database refuses does not fail the others of its batch: each is retried alone', async () => {
    await reserveAll(['a', 'b', 'c'])
    const results = await Promise.allSettled([
      store.complete(held('a'), { replayable: true, response: response(200, 'a'), ttlMs: 60_000 }),
      // An integer column refuses 2^40 (SQLSTATE 22003): the whole batch fails with it.
      store.complete(held('b'), { replayable: true, response: response(2 ** 40, 'b'), ttlMs: 60_000 }),
      store.complete(held('c'), { replayable: true, response: response(200, 'c'), ttlMs: 60_000 }),
    ])
    expect(results[0]).toEqual({ status: 'fulfilled', value: true })
    expect(results[2]).toEqual({ status: 'fulfilled', value: true })
    expect(results[1]!.status).toBe('rejected')
    expect((results[1] as PromiseRejectedResult).reason).toBeInstanceOf(StoreError)
    expect((await t.store.getKey('default', 'b'))?.state).toBe('in_flight')
    // One batch, then each of its three alone.
    expect(db.count).toBe(3 + 1 + 3)
  })

  it('duplicates racing a batch of completions never deadlock: each gets in progress or the replay', async () => {
    // A batch holds its rows' locks until it commits; duplicates lock a fence row, then a key row.
    const keys = Array.from({ length: 40 }, (_, i) => `race${i}`)
    await reserveAll(keys)
    const duplicates = keys.flatMap((key) => [key, key]).reverse().map(async (key) => (await replayOf(key)).kind)
    const completions = keys.map((key) =>
      store.complete(held(key), { replayable: true, response: response(200, key), ttlMs: 60_000 }))
    const [kinds, applied] = await Promise.all([Promise.all(duplicates), Promise.all(completions)])
    expect(applied.every(Boolean)).toBe(true)
    expect(kinds.filter((k) => k !== 'in_progress' && k !== 'replay')).toEqual([])
    for (const key of keys) expect((await replayOf(key)).kind).toBe('replay')
  })

  it('a lost store fails the whole batch at once, without a retry per completion', async () => {
    await reserveAll(['p', 'q', 'r'])
    const before = db.count
    await t.breakStore()
    const results = await Promise.allSettled(['p', 'q', 'r'].map((key) =>
      store.complete(held(key), { replayable: true, response: response(200, key), ttlMs: 60_000 })))
    for (const r of results) {
      expect(r.status).toBe('rejected')
      expect((r as PromiseRejectedResult).reason).toBeInstanceOf(StoreError)
    }
    expect(db.count - before).toBe(1)
  })

  it('closing the store first writes the completions still waiting for their turn', async () => {
    // A schedule that never flushes: only close() can write the batch.
    const pending = createStore(db, { schedule: () => {} })
    await reserveAll(['late'])
    const applied = pending.complete(held('late'), { replayable: true, response: response(200, 'late'), ttlMs: 60_000 })
    await pending.close()
    expect(await applied).toBe(true)
  })

  it('splits a turn at 4 MiB of bodies', async () => {
    const keys = ['m0', 'm1', 'm2']
    await reserveAll(keys)
    const before = db.count
    const big = (key: string) => key.repeat(768 * 1024) // 1.5 MiB each
    const applied = await Promise.all(keys.map((key) =>
      store.complete(held(key), { replayable: true, response: response(200, big(key)), ttlMs: 60_000 })))
    expect(applied).toEqual([true, true, true])
    expect(db.count - before).toBe(2)
    for (const key of keys) {
      const replay = await replayOf(key)
      expect(replay.kind === 'replay' && new TextDecoder().decode(replay.stored.body)).toBe(big(key))
    }
  })

  it('splits a turn of more than 100 completions into statements of at most 100', async () => {
    const keys = Array.from({ length: 150 }, (_, i) => `s${i}`)
    await reserveAll(keys)
    const before = db.count
    const applied = await Promise.all(keys.map((key) =>
      store.complete(held(key), { replayable: true, response: response(200, key), ttlMs: 60_000 })))
    expect(applied.every(Boolean)).toBe(true)
    expect(db.count - before).toBe(2)
  })

  it('without a schedule only completions issued in one synchronous stretch share a statement', async () => {
    const plain = createStore(db)
    await reserveAll(['x', 'y', 'z1', 'z2'])
    const before = db.count
    expect(await plain.complete(held('x'), { replayable: true, response: response(200, 'x'), ttlMs: 60_000 })).toBe(true)
    expect(await plain.complete(held('y'), { replayable: true, response: response(200, 'y'), ttlMs: 60_000 })).toBe(true)
    expect(db.count - before).toBe(2)
    expect(await Promise.all(['z1', 'z2'].map((key) =>
      plain.complete(held(key), { replayable: true, response: response(200, key), ttlMs: 60_000 })))).toEqual([true, true])
    expect(db.count - before).toBe(3)
  })
})
