import { fileURLToPath } from 'node:url'
import { defineConfig } from 'vite'

// The audit console: plain TypeScript and DOM, built into dist/ui and served by the admin plane
// at /ui/ (src/admin/ui.ts). Relative asset URLs, so it works under any prefix.
export default defineConfig({
  root: fileURLToPath(new URL('.', import.meta.url)),
  base: './',
  logLevel: 'warn',
  build: {
    outDir: fileURLToPath(new URL('../dist/ui', import.meta.url)),
    emptyOutDir: true,
    // No data: URIs: the Content-Security-Policy allows only the console's own files.
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    sourcemap: false,
  },
})
