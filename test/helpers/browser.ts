import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { chromium, type BrowserContext, type Page } from 'playwright-core'

/** Debian's Chromium: the browser the console's tests drive (`.ci/run` installs it when missing). */
export const chromiumPath = '/usr/bin/chromium'

/** Where the tests save a screenshot of each screen, for review and for docs/audit.md (git-ignored). */
export const screenshotDir = join(import.meta.dirname, '..', '..', '.screenshots')

/** Why the browser tests cannot run here, or undefined when they can. */
export function browserSkipReason(): string | undefined {
  if (!process.env.DATABASE_URL) return 'DATABASE_URL is not set: the console tests need PostgreSQL'
  if (!existsSync(chromiumPath)) return `${chromiumPath} is missing: the console tests need Chromium (apt-get install -y chromium)`
  return undefined
}

export interface Browser {
  context: BrowserContext
  /** A new tab that fails the test on any Content-Security-Policy violation or page error. */
  page(): Promise<Page>
  /** Problems the page reported: CSP violations, uncaught errors, console errors. */
  problems: string[]
  close(): Promise<void>
}

/**
 * One Chromium for a whole test file, on a fresh profile, with everything that would reach
 * the network on its own switched off.
 */
export async function launchBrowser(): Promise<Browser> {
  const profile = mkdtempSync(join(tmpdir(), 'fencegate-chromium-'))
  mkdirSync(screenshotDir, { recursive: true })
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1366, height: 900 },
  })
  const problems: string[] = []
  return {
    context,
    problems,
    async page() {
      const page = await context.newPage()
      page.on('pageerror', (err) => problems.push(`page error: ${err.message}`))
      page.on('console', (msg) => {
        if (msg.type() === 'error' && !/status of 40[0-9]/.test(msg.text())) problems.push(`console: ${msg.text()}`)
      })
      return page
    },
    async close() {
      await context.close()
      rmSync(profile, { recursive: true, force: true })
    },
  }
}
