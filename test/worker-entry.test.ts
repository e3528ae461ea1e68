import { describe, expect, it } from 'vitest'
import * as entry from '../src/runtime/workers/entry.js'
import { bundleWorker, startWorkerd, wranglerSettings } from './helpers/workerd.js'

/*
 * workerd treats every named export of a Worker's main module as an
 * entrypoint, and refuses to start when one is not a handler: the entry once
 * exported a string and did not load at all, while tests that called the
 * handler inside Node passed. These tests look at the module, at the bundle
 * wrangler uploads, and at workerd itself.
 */

// The handler names workerd calls on a module Worker's default export.
const handlerNames = new Set(['fetch', 'scheduled', 'queue', 'tail', 'trace', 'email', 'test', 'tailStream'])

describe('the Workers entry', () => {
  it('is the main module wrangler.toml names', () => {
    expect(wranglerSettings().main).toBe('src/runtime/workers/entry.ts')
  })

  it('exports the handler object and nothing else', () => {
    expect(Object.keys(entry)).toEqual(['default'])
    const handlers = Object.entries(entry.default)
    expect(handlers.map(([name]) => name).sort()).toEqual(['fetch', 'scheduled'])
    for (const [name, handler] of handlers) {
      expect(handlerNames.has(name)).toBe(true)
      expect(typeof handler).toBe('function')
    }
  })

  it('bundles, as wrangler deploy does, into a module whose only export is the handlers', async () => {
    const bundle = await bundleWorker()
    expect(bundle.exports).toEqual(['default'])
  })

  it('bundles no migration code: the Worker never changes the schema', async () => {
    const { contents } = await bundleWorker()
    expect(contents).not.toContain('fg_migrations')
    expect(contents).toContain('fg_idempotency')
  })

  it('starts in workerd and answers a request, even before it is configured', async () => {
    const mf = await startWorkerd(await bundleWorker(), [{ name: 'unconfigured', bindings: {} }])
    try {
      const res = await mf.dispatchFetch('https://gateway.example/payments/1/capture', { method: 'POST' })
      expect(res.status).toBe(500)
      expect(await res.json()).toMatchObject({ code: 'internal_error', detail: 'fencegate is not configured correctly; see the Worker logs' })
    } finally {
      await mf.dispose()
    }
  })

  it('would not start in workerd with a named export that is not a handler (the check above is not vacuous)', async () => {
    const { contents } = await bundleWorker()
    const withString = `${contents}\nexport const notAHandler = '/_admin/'\n`
    let stderr = ''
    await expect(startWorkerd({ contents: withString }, [{ name: 'broken', bindings: {} }], { onStderr: (text) => (stderr += text) }))
      .rejects.toThrow(/failed to start/)
    expect(stderr).toContain("Incorrect type for map entry 'notAHandler'")
  })
})
