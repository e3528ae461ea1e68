import { createAdminApp } from './admin.js'
import { createAttestationSigner, type AttestationSigner } from './attest.js'
import { createApp } from './app.js'
import { loadConfigText } from './config/text.js'
import { ConfigError, type AuthConfig, type Config } from './config/schema.js'
import { createFetchForward } from './fetch-forward.js'
import type { Forward } from './forward.js'
import { createAuthenticator, type Authenticate, type VerificationKeys } from './identity.js'
import { createLogger, type Logger } from './log.js'
import { FencegateError, problemResponse } from './problems.js'
import { connectPostgres } from './store/postgres.js'
import { purgeRetainedOnWorkers } from './workers-retention.js'
import { createStore } from './store/store.js'

/** The Worker's bindings: vars and secrets are strings; HYPERDRIVE is an optional Hyperdrive binding. */
export interface WorkerEnv {
  /** The configuration, YAML or JSON, with `${VAR}` expanded from the other string bindings. */
  FENCEGATE_CONFIG?: string
  DATABASE_URL?: string
  /** `on` serves the admin plane under /_admin/ (it requires auth.mode: jwt). */
  FENCEGATE_ADMIN?: string
  HYPERDRIVE?: { connectionString: string }
  /** `FENCEGATE_PUBLIC_KEY_<i>`: the PEM of auth.public_keys[i]; `FENCEGATE_ATTESTATION_KEY`: the PEM of attestation.key_file. */
  [binding: string]: unknown
}

/** The part of the Workers ExecutionContext fencegate uses. */
export interface WorkerContext {
  waitUntil(promise: Promise<unknown>): void
}

export interface FencegateWorker {
  fetch(request: Request, ctx: WorkerContext): Promise<Response>
  /** Deletes up to `limit` expired idempotency records; the Node gateway does this every minute. */
  purgeExpired(limit?: number): Promise<number>
  /** Resolves once every request's store has closed (the Worker itself holds no connection). */
  close(): Promise<void>
}

export const adminPrefix = '/_admin/'

/**
 * Builds fencegate for one Workers isolate: the configuration, authenticator
 * and forward are built here once; the store is opened per request, because
 * Workers forbids a socket opened in one request from serving another.
 * Migrations are not run: run `fencegate migrate` against the database first.
 *
 * @example
 * const worker = await createWorker(env)
 * const res = await worker.fetch(request, ctx)
 */
export async function createWorker(env: WorkerEnv): Promise<FencegateWorker> {
  const vars = Object.fromEntries(Object.entries(env).filter((e): e is [string, string] => typeof e[1] === 'string'))
  if (!vars.FENCEGATE_CONFIG) throw new ConfigError(['FENCEGATE_CONFIG: not set (the configuration as YAML or JSON text)'])
  const config = configFromText(vars.FENCEGATE_CONFIG, vars)
  // Hyperdrive first: binding it says how this Worker should reach the database.
  const databaseUrl = env.HYPERDRIVE?.connectionString || config.store.url || vars.DATABASE_URL
  if (!databaseUrl) throw new ConfigError(['DATABASE_URL: not set, and store.url is empty (a Worker has no embedded store)'])
  const adminOn = vars.FENCEGATE_ADMIN === 'on'
  // The Node admin plane without auth is confined to loopback; a Worker has no loopback.
  if (adminOn && config.auth.mode === 'none') throw new ConfigError(['FENCEGATE_ADMIN: the admin plane needs auth.mode: jwt on Workers'])
  if (adminOn) {
    const shadowed = config.routes.find((r) => r.path === adminPrefix.slice(0, -1) || r.path.startsWith(adminPrefix))
    if (shadowed) throw new ConfigError([`routes: ${shadowed.name} is under ${adminPrefix}, which FENCEGATE_ADMIN=on serves`])
  }

  const log = createLogger(config.log.level)
  const authenticate = await createAuthenticator(config.auth, workerKeys(config.auth, vars))
  const attest = await workerAttestationSigner(config, vars)
  const forward = createFetchForward()
  const closing = new Set<Promise<void>>()

  return {
    async fetch(request, ctx) {
      const scope = openRequestScope(databaseUrl, forward)
      let response: Response
      try {
        response = await route(request, scope, { config, authenticate, log, adminOn, attest })
      } catch (err) {
        // The apps render their own errors; this is only reached by a failure in the wiring itself.
        response = problemResponse(new FencegateError('internal_error'), crypto.randomUUID())
        log.error('internal_error', { error: (err as Error)?.name ?? typeof err })
      }
      const { body, done } = whenConsumed(response.body)
      const closed = scope.closeAfter(done)
      closing.add(closed)
      void closed.finally(() => closing.delete(closed))
      ctx.waitUntil(closed)
      return new Response(body, response)
    },
    async purgeExpired(limit = 1000) {
      const store = createStore(connectPostgres(databaseUrl, { max: 1 }))
      try {
        return await store.purgeExpired(limit)
      } finally {
        await store.close().catch(() => {})
      }
    },
    async close() {
      await Promise.all(closing)
    },
  }
}

// The apps are built per request because each binds one store; building one is a few route regexes.
async function route(request: Request, scope: RequestScope, o: { config: Config; authenticate: Authenticate; log: Logger; adminOn: boolean; attest: AttestationSigner | undefined }): Promise<Response> {
  const url = new URL(request.url)
  if (o.adminOn && url.pathname.startsWith(adminPrefix)) {
    url.pathname = url.pathname.slice(adminPrefix.length - 1)
    return createAdminApp({ store: scope.store, authenticate: o.authenticate }).fetch(new Request(url, request))
  }
  return createApp({ config: o.config, store: scope.store, forward: scope.forward, authenticate: o.authenticate, log: o.log, ...(o.attest ? { attest: o.attest } : {}) }).fetch(request)
}

interface RequestScope {
  store: ReturnType<typeof createStore>
  forward: Forward
  /** Closes the store once `clientDone` resolved and every upstream body ended. */
  closeAfter(clientDone: Promise<void>): Promise<void>
}

/**
 * One request's store and forward. The data app may still write after the
 * handler returned: an idempotent answer is stored when its body ends, or,
 * when the client left early, once the rest of the upstream body was read. So
 * the store closes only after the client's body and every upstream body ended.
 */
function openRequestScope(url: string, base: Forward): RequestScope {
  // One connection: a request's queries run one after another.
  const store = createStore(connectPostgres(url, { max: 1 }))
  const upstreamBodies: Promise<void>[] = []
  const forward: Forward = async (request) => {
    const res = await base(request)
    const { body, done } = whenConsumed(res.body)
    upstreamBodies.push(done)
    return new Response(body, res)
  }
  return {
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
function whenConsumed(source: ReadableStream<Uint8Array> | null): { body: ReadableStream<Uint8Array> | null; done: Promise<void> } {
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

/** The `FENCEGATE_CONFIG` binding read as a configuration file is (`loadConfigText`, which imports nothing from `node:*`). */
export function configFromText(text: string, vars: Record<string, string | undefined>, source = 'FENCEGATE_CONFIG'): Config {
  return loadConfigText(text, vars, source)
}

/** Key material from bindings: a Worker has no files, so public_keys[i] is read from FENCEGATE_PUBLIC_KEY_<i>. */
export function workerKeys(auth: AuthConfig, vars: Record<string, string | undefined>): VerificationKeys {
  if (auth.jwks_url) return { kind: 'jwks', url: auth.jwks_url }
  if (auth.public_keys) {
    return {
      kind: 'public',
      keys: auth.public_keys.map((k, i) => {
        const pem = vars[`FENCEGATE_PUBLIC_KEY_${i}`]
        if (!pem) throw new ConfigError([`FENCEGATE_PUBLIC_KEY_${i}: not set (the PEM for auth.public_keys[${i}], ${k.file})`])
        return { pem, alg: k.alg }
      }),
    }
  }
  return { kind: 'hmac', secret: auth.hs256_secret ?? '' }
}

/** The attestation signer from bindings: a Worker has no files, so the private key's PEM is the secret FENCEGATE_ATTESTATION_KEY. */
export async function workerAttestationSigner(config: Config, vars: Record<string, string | undefined>): Promise<AttestationSigner | undefined> {
  if (!config.attestation) return undefined
  const pem = vars.FENCEGATE_ATTESTATION_KEY
  if (!pem) throw new ConfigError([`FENCEGATE_ATTESTATION_KEY: not set (the PEM private key for attestation.key_file, ${config.attestation.key_file})`])
  return createAttestationSigner(config.attestation, pem)
}

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
