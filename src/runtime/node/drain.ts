import type { RequestListener } from 'node:http'

/**
 * A gateway's drain, from the moment it is told to stop (docs/deployment.md#rolling-update):
 * `/readyz` answers `503 draining` at once, while both planes keep serving for
 * `server.drain_delay`, so that load balancers and Kubernetes' endpoints stop sending it
 * traffic before it stops accepting. Every answer given while draining says
 * `Connection: close`: a client's kept-alive connection ends after the answer it is reading,
 * rather than sit idle until the drain closes it under a request the client sends on it.
 */
export interface Drain {
  draining(): boolean
  /** Marks the gateway as draining; idempotent. */
  begin(): void
  /** The listener, with `Connection: close` on every answer given while draining. */
  closing(listener: RequestListener): RequestListener
}

/**
 * A drain that has not begun.
 *
 * @example
 * const drain = createDrain()
 * const server = createServer(drain.closing(listener))
 * process.once('SIGTERM', () => drain.begin())
 */
export function createDrain(): Drain {
  let draining = false
  return {
    draining: () => draining,
    begin() {
      draining = true
    },
    closing: (listener) => (req, res) => {
      // Set before the answer's own headers, which writeHead merges over it (none sets Connection).
      if (draining) res.setHeader('connection', 'close')
      listener(req, res)
    },
  }
}

/**
 * Waits `ms`, the configured `server.drain_delay`: the time load balancers are given to see
 * `/readyz` fail before the gateway stops accepting.
 *
 * @example
 * drain.begin(); await drainDelay(config.server.drain_delay); await gateway.close()
 */
export function drainDelay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms))
}
