import { readFileSync } from 'node:fs'
import { join } from 'node:path'
import { describe, expect, it } from 'vitest'
import { consoleCsp, createConsoleApp } from '../src/admin/ui.js'

// The console's files as the built package serves them: dist/src/admin/ui.js finds dist/ui
// relative to itself, whatever the working directory. (The browser tests are in console.test.ts.)
const built = join(import.meta.dirname, '..', 'dist', 'src', 'admin', 'ui.js')

describe('console static files', () => {
  it.each([['the sources', createConsoleApp], ['the built package', async () => ((await import(built)) as { createConsoleApp: typeof createConsoleApp }).createConsoleApp()]])('are served from %s with the CSP, and nothing else is', async (_from, make) => {
    const app = await make()
    const index = await app.request('/ui/')
    expect(index.status).toBe(200)
    expect(index.headers.get('content-security-policy')).toBe(consoleCsp)
    const html = await index.text()
    expect(html).toBe(readFileSync(join(import.meta.dirname, '..', 'dist', 'ui', 'index.html'), 'utf8'))
    const css = /href="\.\/(assets\/[^"]+\.css)"/.exec(html)![1]!
    expect((await app.request(`/ui/${css}`)).headers.get('content-type')).toBe('text/css; charset=utf-8')
    for (const path of ['/ui/vite.config.ts', '/ui/src/main.ts', '/ui/assets/', '/ui/%2e%2e/package.json']) {
      const res = await app.request(path)
      expect([path, res.status, (await res.json() as { code: string }).code]).toEqual([path, 404, 'not_found'])
    }
  })

  it('answers not_found, naming the build, when the console was not built', async () => {
    const res = await createConsoleApp({ dir: join(import.meta.dirname, 'no-such-dir') }).request('/ui/')
    expect(res.status).toBe(404)
    expect(await res.json()).toMatchObject({ code: 'not_found', detail: expect.stringContaining('npm run build') })
  })
})
