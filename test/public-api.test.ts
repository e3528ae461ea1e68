import { describe, expect, it } from 'vitest'

/**
 * The package's own name resolves to dist/src/index.js (package.json `exports`): what a user
 * imports. Regression: createStore, openPglite and the undici forward could not be imported
 * from the package, though the app's own example used them.
 */
describe('the public API (import from "fencegate")', () => {
  it('exports the planes, the gateway, the stores, the forward, config and the error catalog', async () => {
    const api = await import('fencegate') as Record<string, unknown>
    for (const name of ['createApp', 'createAdminApp', 'startGateway', 'createUndiciForward', 'createStore', 'openPglite',
      'connectPostgres', 'migrate', 'loadMigrations', 'createJobStore', 'parseConfig', 'loadConfigFile', 'FencegateError', 'createAuthenticator']) {
      expect(typeof api[name], name).toBe('function')
    }
  })

  it('serves a fenced route with only what it exports', async () => {
    const { createApp, createStore, createUndiciForward, openPglite, parseConfig } = await import('fencegate')
    const config = parseConfig({ routes: [{ name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream: 'http://127.0.0.1:9', entity: 'invoice:{params.id}', fence: 'required' }] })
    const store = createStore(await openPglite())
    const forward = createUndiciForward()
    try {
      const app = createApp({ config, store, forward: forward.forward })
      const res = await app.request('/payments/42/capture', { method: 'POST', body: '{}' })
      expect([res.status, ((await res.json()) as { code: string }).code]).toEqual([428, 'fence_required'])
    } finally {
      await forward.close()
      await store.close()
    }
  })
})
