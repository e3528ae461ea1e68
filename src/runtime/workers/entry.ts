/*
 * The Worker's main module (wrangler.toml `main`). workerd treats every named
 * export of the main module as an entrypoint and refuses to start when one is
 * not a handler, so this file exports the handler object and nothing else;
 * test/worker-entry.test.ts checks the module and the bundle for it.
 */
import { ConfigError } from '../../config/schema.js'
import { FencegateError, problemResponse } from '../../http/problems.js'
import { createWorker, type FencegateWorker } from './app.js'
import { purgeRetainedOnWorkers } from './retention.js'
import type { WorkerContext, WorkerEnv } from './bindings.js'

// One build per isolate; a failed build is retried by the next request rather than cached.
let built: Promise<FencegateWorker> | undefined

async function workerFor(env: WorkerEnv): Promise<FencegateWorker | undefined> {
  built ??= createWorker(env)
  try {
    return await built
  } catch (err) {
    built = undefined
    const problems = err instanceof ConfigError ? err.problems : [(err as Error)?.name ?? 'error']
    logLine('startup_failed', { problems })
    return undefined
  }
}

function logLine(event: string, fields: Record<string, unknown>): void {
  console.error(JSON.stringify({ time: new Date().toISOString(), level: 'error', event, ...fields }))
}

export default {
  async fetch(request: Request, env: WorkerEnv, ctx: WorkerContext): Promise<Response> {
    const worker = await workerFor(env)
    if (!worker) return problemResponse(new FencegateError('internal_error', 'fencegate is not configured correctly; see the Worker logs'), crypto.randomUUID())
    return worker.fetch(request, ctx)
  },

  /** A Cron Trigger (see wrangler.toml) stands in for the Node gateway's purge interval. */
  async scheduled(_controller: unknown, env: WorkerEnv, ctx: WorkerContext): Promise<void> {
    ctx.waitUntil((async () => {
      const worker = await workerFor(env)
      await worker?.purgeExpired().catch((err: unknown) => logLine('purge_failed', { error: (err as Error)?.name ?? typeof err }))
      await purgeRetainedOnWorkers(env)
    })())
  },
}
