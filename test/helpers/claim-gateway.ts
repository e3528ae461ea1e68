import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { createDataPlane } from '../../src/gateway/app.js'
import { createJobStore, type JobStore } from '../../src/leases/store.js'
import { createClaimWake, type ClaimWake, type ClaimWakeOptions } from '../../src/leases/wake.js'
import { dataPlaneListener, listen } from '../../src/runtime/node/gateway.js'
import { createUndiciForward } from '../../src/runtime/node/forward.js'
import { silentLogger } from '../../src/observe/log.js'
import type { Db } from '../../src/store/db.js'
import type { TestDb } from './backends.js'
import { route, testConfig } from './gateway.js'

// The job API served for the claim-wait tests (test/leases-wait*.test.ts), and the calls they make.

export const waitJobTypes = [
  { name: 'report', lease: '45s', max_attempts: 3, backoff: '0s' },
  { name: 'other', lease: '45s' },
]

export interface ClaimGateway {
  url: string
  wake: ClaimWake
  jobs: JobStore
  close(): Promise<void>
}

/**
 * The real data app over loopback HTTP, served as `fencegate serve` serves it (Node's data
 * plane, straight off the socket), with the claim wake injected. `db` replaces the test's
 * own for the job statements (a counting one, say).
 */
export async function serveClaims(t: TestDb, wakeOptions: Omit<ClaimWakeOptions, 'listen'>, db: Db = t.db): Promise<ClaimGateway> {
  const config = testConfig([route('http://127.0.0.1:9')], { job_types: waitJobTypes })
  const jobs = createJobStore(db)
  const wake = createClaimWake({ listen: jobs.listenForWork, ...wakeOptions })
  const undici = createUndiciForward()
  const plane = createDataPlane({ config, store: t.store, forward: undici.forward, jobs, claimWake: wake })
  const server: Server = await listen(dataPlaneListener(plane, silentLogger), '127.0.0.1', 0, config.server)
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/_fencegate/jobs`,
    wake,
    jobs,
    async close() {
      await new Promise<void>((resolve) => {
        server.close(() => resolve())
        if ('closeAllConnections' in server) server.closeAllConnections()
      })
      await wake.close()
      await undici.close()
    },
  }
}

/** One JSON call; a problem's `Retry-After` comes back with it. */
export async function call(url: string, body?: unknown, init: { method?: string; signal?: AbortSignal } = {}) {
  const res = await fetch(url, {
    method: init.method ?? 'POST', headers: { 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }), ...(init.signal ? { signal: init.signal } : {}),
  })
  const text = await res.text()
  return { status: res.status, json: text ? JSON.parse(text) : undefined, retryAfter: res.headers.get('retry-after') }
}

/** Polls a condition on state (the wake's counters or the database), never a fixed sleep. */
export async function until(what: string, check: () => boolean | Promise<boolean>, limitMs = 15_000): Promise<void> {
  const giveUp = performance.now() + limitMs
  while (!(await check())) {
    if (performance.now() > giveUp) throw new Error(`timed out waiting until ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 5))
  }
}
