import { abandonedKeys, type AbandonedKeys } from './abandoned.js'
import type { AttestationSigner } from './attest.js'
import { sha256Hex, type Digest } from '../http/body.js'
import type { Config } from '../config/schema.js'
import type { Forward } from './forward.js'
import type { Authenticate } from '../http/identity.js'
import type { Logger } from '../observe/log.js'
import type { Metrics } from '../observe/metrics.js'
import { noTracing, type Tracing } from '../observe/tracing.js'
import type { RuleSource } from '../rules/registry.js'
import type { Store } from '../store/store.js'
import { keysPolledAtOnce, outcomeWaits, type OutcomeWaits } from './outcome-waits.js'

/** What the data-plane pipeline is built from; each runtime injects its own. */
export interface PipelineDeps {
  config: Config
  /** Read once per request: a request is judged by one rule version from start to end. */
  rules: RuleSource
  store: Store
  forward: Forward
  authenticate: Authenticate
  log: Logger
  metrics: Metrics
  /** SHA-256 for the body, the key and the fingerprint; Web Crypto unless the runtime injects a faster one. */
  digest?: Digest
  /** Signs `Fence-Attestation` for routes with `attest: true`; absent when the gateway has no attestation key. */
  attest?: AttestationSigner
  /** Spans of each request (src/observe/tracing.ts); defaults to none. */
  tracing?: Tracing
  /** `db.system.name` of the store's spans: `postgresql` (the default) or `pglite`. */
  storeSystem?: string
  /**
   * How duplicates wait on in-flight keys (src/gateway/outcome-waits.ts); defaults to one poll
   * per key over `store`, at most `keysPolledAtOnce(store.max_connections)` keys. A process
   * whose pool is smaller (one of `server.workers`) passes its own.
   */
  outcomeWaits?: OutcomeWaits
}

/** The dependencies every step of the pipeline reads, with their defaults settled once. */
export interface PipelineContext extends PipelineDeps {
  digest: Digest
  tracing: Tracing
  storeSystem: string
  bodyLimit: number
  outcomeWaits: OutcomeWaits
  /** Keys held by reservations whose answer was lost, released by this process (src/gateway/abandoned.ts). */
  abandoned: AbandonedKeys
}

export function contextOf(deps: PipelineDeps): PipelineContext {
  const waits = deps.outcomeWaits ?? outcomeWaits(deps.store, { maxKeys: keysPolledAtOnce(deps.config.store.max_connections) })
  // Every settling write goes through `watching`, so a key this process settles (or frees) wakes its duplicates at once.
  const store = waits.watching(deps.store)
  return { ...deps, store, outcomeWaits: waits, digest: deps.digest ?? sha256Hex, tracing: deps.tracing ?? noTracing, storeSystem: deps.storeSystem ?? 'postgresql', bodyLimit: deps.config.server.max_request_body, abandoned: abandonedKeys(store, deps.log) }
}
