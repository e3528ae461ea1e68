import { afterAll, afterEach, beforeAll, beforeEach } from 'vitest'
import type { Backend, TestDb } from './backends.js'
import { startTestGateway, type TestGateway } from './gateway.js'
import { startUpstream, type TestUpstream } from './upstream.js'

type GatewayOptions = Omit<Parameters<typeof startTestGateway>[0], 'store'>

/** What each test of the block gets: its own database, upstream and gateway. */
export interface FreshGateway {
  t: TestDb
  upstream: TestUpstream
  gw: TestGateway
}

/**
 * "A gateway on a fresh database with a real upstream", for every test of a describe block:
 * opened before each test, closed after it. `options` builds the gateway from the upstream
 * (its URL goes into the routes) and the database.
 *
 * @example
 * const fx = freshGateway(backend, ({ upstream }) => ({ config: testConfig([route(upstream.url)]) }))
 * it('...', async () => { await post(`${fx.gw.url}/payments/1/capture`, '1') })
 */
export function freshGateway(backend: Backend, options: (f: Omit<FreshGateway, 'gw'>) => GatewayOptions | Promise<GatewayOptions>): FreshGateway {
  return gatewayPer(beforeEach, afterEach, backend, options)
}

/**
 * The same, once for the whole describe block: its tests share the database, the upstream
 * and the gateway (and see each other's requests in `upstream.received`).
 *
 * @example
 * const fx = sharedGateway(backends()[0]!, ({ upstream }) => ({ config: testConfig([route(upstream.url)]) }))
 */
export function sharedGateway(backend: Backend, options: (f: Omit<FreshGateway, 'gw'>) => GatewayOptions | Promise<GatewayOptions>): FreshGateway {
  return gatewayPer(beforeAll, afterAll, backend, options)
}

function gatewayPer(before: typeof beforeAll, after: typeof afterAll, backend: Backend, options: (f: Omit<FreshGateway, 'gw'>) => GatewayOptions | Promise<GatewayOptions>): FreshGateway {
  const f = {} as FreshGateway
  before(async () => {
    f.t = await backend.open()
    f.upstream = await startUpstream()
    f.gw = await startTestGateway({ ...await options(f), store: f.t.store })
  })
  after(async () => {
    await f.gw?.close()
    await f.upstream?.close()
    await f.t?.close()
  })
  return f
}
