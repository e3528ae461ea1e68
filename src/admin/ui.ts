import { Hono } from 'hono'
import { FencegateError, problemResponse } from '../http/problems.js'

/**
 * The console's Content-Security-Policy: the page runs only its own files, built by Vite
 * into one script and one style sheet; no inline script or style, no other origin, no
 * framing. It talks to the admin plane it was served from (`connect-src 'self'`).
 */
export const consoleCsp = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self'",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
  "object-src 'none'",
].join('; ')

interface Asset { body: Uint8Array; type: string; immutable: boolean }

const types: Record<string, string> = {
  html: 'text/html; charset=utf-8',
  js: 'text/javascript; charset=utf-8',
  css: 'text/css; charset=utf-8',
  svg: 'image/svg+xml',
  png: 'image/png',
  ico: 'image/x-icon',
  json: 'application/json',
  txt: 'text/plain; charset=utf-8',
  woff2: 'font/woff2',
}

/**
 * Reads every file of the built console once into memory: the set of servable paths is
 * exactly what the build produced, so no request path can reach anything else.
 * From the built package (dist/src/admin/ui.js) the build is dist/ui; from the sources
 * (src/admin/ui.ts, as the tests import it) it is dist/ui, two folders up.
 * `node:fs` is imported here, lazily, so the Workers bundle of the admin plane never needs it.
 */
async function loadAssets(dir?: string): Promise<Map<string, Asset>> {
  const { readdir, readFile } = await import('node:fs/promises')
  const { fileURLToPath } = await import('node:url')
  const { join, relative, sep } = await import('node:path')
  const root = dir ?? fileURLToPath(new URL(import.meta.url.endsWith('.ts') ? '../../dist/ui/' : '../../ui/', import.meta.url))
  const assets = new Map<string, Asset>()
  const entries = await readdir(root, { recursive: true, withFileTypes: true })
  for (const entry of entries) {
    if (!entry.isFile()) continue
    const full = join(entry.parentPath, entry.name)
    const rel = relative(root, full).split(sep).join('/')
    const ext = rel.slice(rel.lastIndexOf('.') + 1)
    const type = types[ext]
    if (!type) continue
    // Vite names built assets by content hash, so they may be cached for good.
    assets.set(rel, { body: new Uint8Array(await readFile(full)), type, immutable: rel.startsWith('assets/') })
  }
  if (!assets.has('index.html')) throw new Error('no index.html')
  return assets
}

/**
 * The audit console: static files under `/ui/`, served without authentication (they hold
 * no tenant data; every call the page makes carries the token the page asks for) and
 * with a strict Content-Security-Policy.
 *
 * @example
 * admin.route('/ui', createConsoleApp())   // before the admin plane's authentication
 */
export function createConsoleApp(options: { dir?: string } = {}): Hono {
  let assets: Promise<Map<string, Asset> | undefined> | undefined
  const app = new Hono()
  app.get('/', (c) => c.redirect(`${new URL(c.req.url).pathname}/`, 308))
  app.get('/*', async (c) => {
    assets ??= loadAssets(options.dir).catch(() => undefined)
    const files = await assets
    const requestId = crypto.randomUUID()
    if (!files) return problemResponse(new FencegateError('not_found', 'the console is not built: run npm run build (it is served by the Node gateway only)'), requestId)
    const rel = c.req.path.replace(/^\/ui\/?/, '') || 'index.html'
    const asset = files.get(rel)
    if (!asset) return problemResponse(new FencegateError('not_found', 'no such file in the console'), requestId)
    return c.body(asset.body as Uint8Array<ArrayBuffer>, 200, {
      'content-type': asset.type,
      'content-security-policy': consoleCsp,
      'x-content-type-options': 'nosniff',
      'referrer-policy': 'no-referrer',
      'x-frame-options': 'DENY',
      'cache-control': asset.immutable ? 'public, max-age=31536000, immutable' : 'no-cache',
    })
  })
  return app
}
