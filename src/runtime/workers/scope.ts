import type { Forward } from '../../gateway/forward.js'
import type { Db } from '../../store/db.js'
import { createStore, type Store } from '../../store/store.js'
import { connectWorkersPostgres } from './db.js'

export interface RequestScope {
  /** The request's connection, for the job statements; `store` runs on it too. */
  db: Db
  store: Store
  forward: Forward
  /** Closes the store once `clientDone` resolved and every upstream body ended. */
  closeAfter(clientDone: Promise<void>): Promise<void>
}

/**
 * One request's store and forward. The data app may still write after the
 * handler returned: an idempotent answer is stored when its body ends, or,
 * when the client left early, once the rest of the upstream body was read. So
 * the store closes only after the client's body and every upstream body ended.
 * The connection itself opens on the store's first statement.
 */
export function openRequestScope(url: string, base: Forward): RequestScope {
  const db = connectWorkersPostgres(url)
  const store = createStore(db)
  const upstreamBodies: Promise<void>[] = []
  const forward: Forward = async (request) => {
    const answer = await base(request)
    // Bytes are already read; only a stream is still to be consumed.
    if (!(answer.body instanceof ReadableStream)) return answer
    const { body, done } = whenConsumed(answer.body)
    upstreamBodies.push(done)
    return { ...answer, body }
  }
  return {
    db,
    store,
    forward,
    async closeAfter(clientDone) {
      await clientDone
      await Promise.all(upstreamBodies)
      // The write that follows a body's end is issued a few microtasks later; a macrotask is past it.
      await new Promise((resolve) => setTimeout(resolve, 0))
      await store.close().catch(() => {})
    },
  }
}

/** Passes a body through and resolves `done` when it ended, failed or was cancelled. */
export function whenConsumed(source: ReadableStream<Uint8Array> | null): { body: ReadableStream<Uint8Array> | null; done: Promise<void> } {
  if (source === null) return { body: null, done: Promise.resolve() }
  let end!: () => void
  const done = new Promise<void>((resolve) => (end = resolve))
  const reader = source.getReader()
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const { value, done: finished } = await reader.read()
        if (finished) {
          controller.close()
          end()
        } else {
          controller.enqueue(value)
        }
      } catch (err) {
        controller.error(err)
        end()
      }
    },
    async cancel(reason) {
      await reader.cancel(reason).catch(() => {})
      end()
    },
  }, { highWaterMark: 0 })
  return { body, done }
}
