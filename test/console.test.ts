import { existsSync } from 'node:fs'
import { join } from 'node:path'
import type { Page } from 'playwright-core'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createJobStore } from '../src/leases/store.js'
import { silentLogger } from '../src/observe/log.js'
import { startRuleRegistry, type RuleRegistry } from '../src/rules/registry.js'
import { backends, type TestDb } from './helpers/backends.js'
import { browserSkipReason, launchBrowser, screenshotDir, type Browser } from './helpers/browser.js'
import { post, route, startTestGateway, testConfig, type TestGateway } from './helpers/gateway.js'
import { startTracing, type NodeTracing } from '../src/runtime/node/tracing.js'
import { tracingSettings } from '../src/runtime/node/tracing-env.js'
import { spanKind, startCollector, type Collector } from './helpers/otlp.js'
import { ticketsRoute } from './helpers/mcp-ticket-server.js'
import { hmacAuthenticator, jwtAuth, token } from './helpers/tokens.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

// The audit console in a real Chromium against a real gateway on PostgreSQL, under
// auth.mode: jwt so every row names its caller. The test makes the traffic the screens show:
// worker-a loses invoice:42 to worker-b and keeps writing; an operator finds it and bumps.
// The gateway traces, so every row names the trace of the command that caused it.
const skip = browserSkipReason()
if (skip) console.warn(`console tests skipped: ${skip}`)

const built = join(import.meta.dirname, '..', 'dist', 'ui', 'index.html')

describe.skipIf(skip !== undefined)('audit console in Chromium', () => {
  let t: TestDb
  let upstream: TestUpstream
  let gw: TestGateway
  let registry: RuleRegistry
  let browser: Browser
  let page: Page
  let adminToken: string
  let collector: Collector
  let traced: NodeTracing

  const as = async (sub: string) => ({ authorization: `Bearer ${await token({ sub })}` })
  const capture = async (sub: string, invoice: number, fence?: string) =>
    post(`${gw.url}/payments/${invoice}/capture`, fence, { headers: await as(sub) })
  const admin = async (path: string, init: RequestInit = {}) => {
    const res = await fetch(`${gw.adminUrl}${path}`, { ...init, headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json', ...init.headers as Record<string, string> } })
    return { status: res.status, json: await res.json() as any }
  }
  const shot = (name: string, fullPage = true) => page.screenshot({ path: join(screenshotDir, `${name}.png`), fullPage })
  const open = async (hash: string) => {
    await page.goto(`${gw.adminUrl}/ui/${hash}`)
    await page.locator('main h1').waitFor()
  }
  const texts = (selector: string) => page.locator(selector).allTextContents()

  beforeAll(async () => {
    if (!existsSync(built)) throw new Error('dist/ui is missing: run npm run build first (npm test does)')
    t = await backends().find((b) => b.name === 'postgres')!.open()
    upstream = await startUpstream()
    // The MCP recipe's route too: its refusals carry the rule's own route name (tickets-mcp/create_ticket).
    const config = testConfig([route(upstream.url), ticketsRoute(upstream.url)], {
      auth: jwtAuth,
      job_types: [{ name: 'send-invoice', lease: '45s' }],
    })
    registry = await startRuleRegistry({ db: t.db, config, log: silentLogger })
    collector = await startCollector()
    traced = startTracing(tracingSettings({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: collector.url })!, silentLogger)
    gw = await startTestGateway({ config, store: t.store, authenticate: await hmacAuthenticator(), jobs: createJobStore(t.db), rules: { registry, db: t.db }, db: t.db, tracing: traced.tracing })
    adminToken = await token({ sub: 'operator-alice', scope: 'fencegate:admin' })
    browser = await launchBrowser()
    page = await browser.page()

    // worker-a holds invoice:42 with fence 1, stalls; worker-b takes over with fence 2.
    expect((await capture('worker-a', 42, '1')).status).toBe(200)
    expect((await capture('worker-a', 42, '1')).status).toBe(200)
    expect((await capture('worker-b', 42, '2')).status).toBe(200)
    // worker-a wakes up and keeps writing with its old fence: three refusals.
    for (let i = 0; i < 3; i++) expect((await capture('worker-a', 42, '1')).json.code).toBe('stale_fence')
    // A misconfigured worker sends no fence at all.
    expect((await capture('worker-c', 43)).json.code).toBe('fence_required')
  })

  afterAll(async () => {
    await browser?.close()
    await gw?.close()
    await traced?.shutdown()
    await collector?.close()
    await registry?.close()
    await upstream?.close()
    await t?.close()
  })

  it('serves the console with a strict Content-Security-Policy and no inline script or style', async () => {
    const res = await fetch(`${gw.adminUrl}/ui/`)
    expect(res.status).toBe(200)
    const csp = res.headers.get('content-security-policy')!
    expect(csp).toContain("default-src 'self'")
    expect(csp).not.toContain('unsafe-inline')
    const html = await res.text()
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/)
    expect(html).not.toMatch(/<style|\sstyle=/)
    expect(res.headers.get('x-content-type-options')).toBe('nosniff')
    expect(res.headers.get('referrer-policy')).toBe('no-referrer')
    expect(res.headers.get('cache-control')).toBe('no-cache')
    const script = /src="\.\/(assets\/[^"]+\.js)"/.exec(html)![1]
    const asset = await fetch(`${gw.adminUrl}/ui/${script}`)
    expect([asset.status, asset.headers.get('cache-control'), asset.headers.get('content-type')]).toEqual([200, 'public, max-age=31536000, immutable', 'text/javascript; charset=utf-8'])
    expect((await fetch(`${gw.adminUrl}/ui`, { redirect: 'manual' })).headers.get('location')).toBe('/ui/')
    expect((await fetch(`${gw.adminUrl}/ui/nothing.js`)).status).toBe(404)
  })

  it('asks for a token under auth.mode: jwt, keeps it for the tab, and sends it with every call', async () => {
    await page.goto(`${gw.adminUrl}/ui/#/rejections`)
    const dialog = page.locator('#token-dialog')
    await dialog.waitFor({ state: 'visible' })
    await shot('token-prompt')
    await page.fill('#token-input', 'not-a-token')
    await page.keyboard.press('Enter')
    await page.locator('#token-error', { hasText: 'refused the token' }).waitFor()
    await page.fill('#token-input', adminToken)
    await page.keyboard.press('Enter')
    await dialog.waitFor({ state: 'hidden' })
    await page.locator('#rejections-table tbody tr').first().waitFor()
    expect(await page.evaluate(() => sessionStorage.getItem('fencegate.token'))).toBe(adminToken)
    // A reload keeps the token: no prompt again.
    await page.reload()
    await page.locator('#rejections-table tbody tr').first().waitFor()
    expect(await dialog.isVisible()).toBe(false)
  })

  it('charts the rejections the test caused, by code', async () => {
    await open('#/rejections')
    const count = (code: string) => page.locator(`#rejections-summary tr[data-code="${code}"] td.num`)
    await count('stale_fence').waitFor()
    expect(await count('stale_fence').textContent()).toBe('3')
    expect(await count('fence_required').textContent()).toBe('1')
    expect(await page.locator('#rejections-chart').getAttribute('data-total')).toBe('4')
    expect(await page.locator('#rejections-chart canvas').count()).toBeGreaterThan(0)
    await shot('rejections')
  })

  it('narrows the table with filters: by code, by caller, by entity', async () => {
    await open('#/rejections')
    await page.fill('input[name=code]', 'stale_fence')
    await page.locator('form.filters button[type=submit]').click()
    await page.waitForFunction(() => location.hash.includes('code=stale_fence'))
    await page.locator('#rejections-table tbody tr').first().waitFor()
    expect(new Set(await texts('#rejections-table tbody td:nth-child(2)'))).toEqual(new Set(['stale_fence']))
    expect(await page.locator('#rejections-table tbody tr').count()).toBe(3)

    await open('#/rejections?caller=worker-c')
    await page.locator('#rejections-table tbody tr').first().waitFor()
    expect(await texts('#rejections-table tbody td:nth-child(2)')).toEqual(['fence_required'])
    // The entity is named even though the request was refused for its missing header.
    expect(await texts('#rejections-table tbody td:nth-child(4)')).toEqual(['invoice:43'])

    await open('#/rejections?entity=invoice%3A42')
    await page.locator('#rejections-table tbody tr').first().waitFor()
    expect(await page.locator('#rejections-table tbody tr').count()).toBe(3)
    await shot('rejections-filtered')
  })

  it('shows each rejection\'s trace id, copies it, and narrows the table to one trace', async () => {
    await traced.flush()
    const staleTraces = collector.spans.filter((s) => s.kind === spanKind.server && s.attributes['fencegate.decision'] === 'stale_fence').map((s) => s.traceId)
    expect(staleTraces).toHaveLength(3)
    await open('#/rejections?code=stale_fence')
    await page.locator('#rejections-table tbody tr').first().waitFor()
    // The last column: the trace id of the very command each row is about, as the trace backend has it.
    const shown = await texts('#rejections-table tbody td:nth-child(10) code.trace-id')
    expect(new Set(shown)).toEqual(new Set(staleTraces))
    await browser.context.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: gw.adminUrl })
    const first = page.locator('#rejections-table tbody tr').first()
    await first.locator('td.trace button').click()
    await first.locator('td.trace button', { hasText: 'Copied' }).waitFor()
    expect(await page.evaluate(() => navigator.clipboard.readText())).toBe(shown[0])

    // The filter field: exactly that trace's row, and the chart counts it alone.
    await open('#/rejections')
    await page.fill('input[name=trace_id]', shown[1]!)
    await page.locator('form.filters button[type=submit]').click()
    await page.waitForFunction((id) => location.hash.includes(`trace_id=${id}`), shown[1]!)
    await page.locator('#rejections-table tbody tr td.trace', { hasText: shown[1]! }).waitFor()
    expect(await page.locator('#rejections-table tbody tr').count()).toBe(1)
    await page.locator('#rejections-chart[data-total="1"]').waitFor()
    await shot('rejections-trace')
    // Each row links to its trace's rows.
    await open('#/rejections?code=stale_fence')
    await page.locator('#rejections-table tbody tr').nth(2).locator('td.trace a').click()
    await page.waitForFunction((id) => location.hash === `#/rejections?trace_id=${id}`, shown[2]!)
    await page.locator('#rejections-table tbody tr td.trace', { hasText: shown[2]! }).waitFor()
    expect(await page.locator('#rejections-table tbody tr').count()).toBe(1)
    // Not a trace id: the admin plane's 400, in words.
    await open('#/rejections?trace_id=XYZ')
    await page.locator('#rejections-table .notice.error', { hasText: 'trace_id must be a trace id' }).waitFor()
  })

  it('pages the table by keyset: older pages hold the next rows, none twice', async () => {
    for (let i = 0; i < 30; i++) expect((await capture('worker-d', 44, 'x')).json.code).toBe('invalid_fence')
    await open('#/rejections?code=invalid_fence')
    await page.locator('#rejections-table tbody tr').first().waitFor()
    const first = await page.locator('#rejections-table tbody tr').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-id')))
    expect(first).toHaveLength(25)
    await page.locator('#older').click()
    await page.locator('.pager span', { hasText: 'Page 2' }).waitFor()
    const second = await page.locator('#rejections-table tbody tr').evaluateAll((rows) => rows.map((r) => r.getAttribute('data-id')))
    expect(second).toHaveLength(5)
    expect(second.filter((id) => first.includes(id))).toEqual([])
    expect(await page.locator('#older').isDisabled()).toBe(true)
  })

  it('shows an entity\'s fence history in order, linked from its rejections', async () => {
    await open('#/rejections?code=stale_fence')
    await page.locator('#rejections-table tbody tr a', { hasText: 'invoice:42' }).first().click()
    await page.locator('#highest-fence').waitFor()
    expect(await page.locator('#highest-fence').textContent()).toBe('2')
    await page.locator('#entity-history tbody tr').first().waitFor()
    const rows = await page.locator('#entity-history tbody tr').evaluateAll((trs) => trs.map((tr) => [...tr.querySelectorAll('td')].map((td) => td.textContent)))
    // Newest first: worker-b raised 1 → 2 after worker-a's first acceptance (none → 1); equal fences wrote nothing.
    expect(rows.map((r) => [r[1], r[2], r[3], r[4]])).toEqual([
      ['1 → 2', 'command', 'capture', 'worker-b'],
      ['none → 1', 'command', 'capture', 'worker-a'],
    ])
    expect(await page.locator('#entity-rejections tbody tr').count()).toBe(3)
    expect(await page.locator('#entity-chart canvas').count()).toBeGreaterThan(0)
    await shot('entity')
  })

  it('bumps from the console after a confirmation, cutting off the old holder; the new rejection arrives live', async () => {
    await open('#/entity/invoice%3A42?tenant=acme')
    await page.locator('#bump').waitFor()
    expect(await page.inputValue('#bump-fence')).toBe('3')
    await page.locator('#bump').click()
    await page.locator('#confirm-dialog', { hasText: 'below 3' }).waitFor({ state: 'visible' })
    await shot('bump-confirm', false)
    // Cancel first: nothing changes.
    await page.locator('#confirm-cancel').click()
    expect((await admin('/entities/invoice:42')).json.highest_fence).toBe('2')
    await page.locator('#bump').click()
    await page.locator('#confirm-ok').click()
    await page.locator('#highest-fence', { hasText: '3' }).waitFor()
    await page.locator('#entity-history tbody tr', { hasText: 'operator bump' }).waitFor()
    expect(await page.locator('#entity-history tbody tr').first().textContent()).toContain('operator-alice')

    // worker-b, the holder of fence 2, is cut off; a new holder at 3 is accepted.
    await open('#/rejections?entity=invoice%3A42')
    await page.locator('#rejections-table tbody tr').first().waitFor()
    expect((await capture('worker-b', 42, '2')).json.code).toBe('stale_fence')
    await page.locator('#rejections-table tbody tr.new', { hasText: 'worker-b' }).waitFor()
    expect((await capture('worker-e', 42, '3')).status).toBe(200)
    await shot('rejections-live')
  })

  it('freezes and unfreezes an entity through a rule, with a confirmation', async () => {
    await open('#/entity/invoice%3A42?tenant=acme')
    await page.locator('#freeze-button').click()
    await page.locator('#confirm-ok').click()
    await page.locator('#unfreeze').waitFor()
    await expect.poll(async () => (await capture('worker-e', 42, '3')).status).toBe(423)
    await shot('entity-frozen')
    await page.locator('#unfreeze').click()
    await page.locator('#confirm-ok').click()
    await page.locator('#freeze-button').waitFor()
    await expect.poll(async () => (await capture('worker-e', 42, '3')).status).toBe(200)
  })

  it('lists jobs with their holder, fence, attempt and a lease counting down', async () => {
    // The job API's verbs need their scopes (docs/leases.md#the-job-api).
    const worker = { authorization: `Bearer ${await token({ sub: 'worker-a', scope: 'jobs:start jobs:work' })}` }
    const jobsApi = async (path: string, body: unknown) => (await fetch(`${gw.url}/_fencegate/jobs${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...worker }, body: JSON.stringify(body) })).json() as any
    await jobsApi('', { type: 'send-invoice', key: 'invoice-42' })
    await jobsApi('', { type: 'send-invoice', key: 'invoice-43' })
    const claimed = await jobsApi('/claim', { worker_id: 'worker-a' })
    await open('#/jobs')
    const row = page.locator(`#jobs-table tr[data-job="${claimed.job_id}"]`)
    await row.waitFor()
    const cells = await row.locator('td').allTextContents()
    expect(cells.slice(3, 7)).toEqual(['running', 'worker-a', '1', '1'])
    const left = cells[7]!
    expect(left).toMatch(/^\d+ s$/)
    await page.waitForFunction(([id, before]) => document.querySelector(`tr[data-job="${id}"] [data-deadline]`)?.textContent !== before, [claimed.job_id, left] as const)
    expect(await page.locator('#jobs-table tbody tr').count()).toBe(2)
    await open('#/jobs?state=queued')
    await page.locator('#jobs-table tbody tr').first().waitFor()
    expect(await texts('#jobs-table tbody td:nth-child(4)')).toEqual(['queued'])
    await open('#/jobs')
    await row.waitFor()
    await shot('jobs')
  })

  it('releases a held job from the Jobs screen after a confirmation, in the tenant its field names', async () => {
    const worker = { authorization: `Bearer ${await token({ sub: 'worker-a', scope: 'jobs:start jobs:work' })}` }
    const jobsApi = async (path: string, body: unknown) => fetch(`${gw.url}/_fencegate/jobs${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...worker }, body: JSON.stringify(body) })
    await jobsApi('', { type: 'send-invoice', key: 'invoice-44' })
    const claimed = await (await jobsApi('/claim', { worker_id: 'worker-a' })).json() as { job_id: string; fence: string }
    await open('#/jobs?tenant=other')
    await page.locator('#jobs-table', { hasText: 'No jobs match.' }).waitFor()
    expect(await page.inputValue('input[name="tenant"]')).toBe('other')
    await open('#/jobs?tenant=acme')
    const row = page.locator(`#jobs-table tr[data-job="${claimed.job_id}"]`)
    await row.locator('button[data-action="release"]').click()
    await page.locator('#confirm-dialog', { hasText: `above ${claimed.fence}` }).waitFor({ state: 'visible' })
    await shot('job-release-confirm', false)
    await page.locator('#confirm-ok').click()
    await page.locator('#job-action-result', { hasText: 'queued' }).waitFor()
    await row.locator('td:nth-child(4)', { hasText: 'queued' }).waitFor()
    const beat = await jobsApi(`/${claimed.job_id}/heartbeat`, { worker_id: 'worker-a', fence: claimed.fence })
    expect([beat.status, (await beat.json() as any).code]).toEqual([409, 'lease_lost'])
    const audit = await admin(`/audit?tenant=acme&entity=job:${claimed.job_id}`)
    expect(audit.json.items.map((a: any) => [a.code, a.caller])).toEqual([['job_released', 'operator-alice']])
  })

  it('cancels a queued job and asks a running one\'s holder to stop, after a confirmation that says which; dismissing it changes nothing', async () => {
    const worker = { authorization: `Bearer ${await token({ sub: 'worker-a', scope: 'jobs:start jobs:work' })}` }
    const jobsApi = async (path: string, body: unknown) => fetch(`${gw.url}/_fencegate/jobs${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...worker }, body: JSON.stringify(body) })
    // Claim before starting the new job, so the claim takes an older queued one and the new one stays queued.
    await jobsApi('', { type: 'send-invoice', key: 'invoice-45' })
    const held = await (await jobsApi('/claim', { worker_id: 'worker-a' })).json() as { job_id: string; fence: string }
    const queued = await (await jobsApi('', { type: 'send-invoice', key: 'invoice-46' })).json() as { job_id: string; state: string }
    expect(queued.state).toBe('queued')
    const job = async (id: string) => (await admin(`/jobs/${id}?tenant=acme`)).json
    // An earlier test may have released the claimed job: only this test's actions are compared.
    const audited = async (id: string) => (await admin(`/audit?tenant=acme&entity=job:${id}`)).json.items.filter((a: any) => a.code !== 'job_released').map((a: any) => [a.code, a.caller])

    // A hash of its own: the previous test left the page on #/jobs?tenant=acme, and the same hash would not render again.
    await open('#/jobs?tenant=acme&type=send-invoice')
    const row = page.locator(`#jobs-table tr[data-job="${queued.job_id}"]`)
    await row.locator('button[data-action="cancel"]').click()
    await page.locator('#confirm-dialog', { hasText: 'cancelled now and no worker will claim it' }).waitFor({ state: 'visible' })
    await shot('job-cancel-confirm', false)
    // Dismissed: the job stays queued, nothing is audited, the row keeps its action.
    await page.locator('#confirm-cancel').click()
    await page.locator('#confirm-dialog').waitFor({ state: 'hidden' })
    expect([(await job(queued.job_id)).state, await audited(queued.job_id)]).toEqual(['queued', []])
    await expect.poll(() => row.locator('td:nth-child(4)').textContent()).toBe('queued')
    await row.locator('button[data-action="cancel"]').click()
    await page.locator('#confirm-ok').click()
    await page.locator('#job-action-result', { hasText: `Job ${queued.job_id}: cancel done; it is cancelled now.` }).waitFor()
    await row.locator('td:nth-child(4)', { hasText: 'cancelled' }).waitFor()
    expect(await row.locator('button[data-action="cancel"]').count()).toBe(0)
    expect((await job(queued.job_id)).state).toBe('cancelled')
    expect(await audited(queued.job_id)).toEqual([['job_cancelled', 'operator-alice']])
    // No worker claims it: a claim of everything due takes the other queued jobs, never this one.
    const next = await jobsApi('/claim', { worker_id: 'worker-a', max: 100 })
    const taken = next.status === 200 ? (await next.json() as { jobs: { job_id: string }[] }).jobs.map((j) => j.job_id) : []
    expect(taken).not.toContain(queued.job_id)

    // A running job: the confirmation names the holder; its next heartbeat hears of the cancel.
    const running = page.locator(`#jobs-table tr[data-job="${held.job_id}"]`)
    await running.locator('button[data-action="cancel"]').click()
    await page.locator('#confirm-dialog', { hasText: 'The holder (worker-a) is told at its next heartbeat' }).waitFor({ state: 'visible' })
    await page.locator('#confirm-ok').click()
    await page.locator('#job-action-result', { hasText: `Job ${held.job_id}: cancel done; it is running now.` }).waitFor()
    await running.locator('td:nth-child(4)', { hasText: 'running (cancel requested)' }).waitFor()
    expect(await running.locator('button[data-action="cancel"]').count()).toBe(0)
    const beat = await jobsApi(`/${held.job_id}/heartbeat`, { worker_id: 'worker-a', fence: held.fence })
    expect([beat.status, (await beat.json() as any).cancel_requested]).toEqual([200, true])
    expect((await (await jobsApi(`/${held.job_id}/release`, { worker_id: 'worker-a', fence: held.fence })).json() as any).state).toBe('cancelled')
    expect((await job(held.job_id)).state).toBe('cancelled')
    expect(await audited(held.job_id)).toEqual([['job_cancelled', 'operator-alice']])
  })

  it('retries a failed job from the Jobs screen after a confirmation: queued again, attempt 0, audited as job_retried', async () => {
    const worker = { authorization: `Bearer ${await token({ sub: 'worker-a', scope: 'jobs:start jobs:work' })}` }
    const jobsApi = async (path: string, body: unknown) => fetch(`${gw.url}/_fencegate/jobs${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...worker }, body: JSON.stringify(body) })
    await jobsApi('', { type: 'send-invoice', key: 'invoice-47' })
    const held = await (await jobsApi('/claim', { worker_id: 'worker-a' })).json() as { job_id: string; fence: string }
    const failed = await jobsApi(`/${held.job_id}/fail`, { worker_id: 'worker-a', fence: held.fence, error: { message: 'smtp down' }, retryable: false })
    expect((await failed.json() as any).state).toBe('failed')

    await open('#/jobs?tenant=acme&state=failed')
    const row = page.locator(`#jobs-table tr[data-job="${held.job_id}"]`)
    await row.locator('td:nth-child(4)', { hasText: 'failed (not_retryable)' }).waitFor()
    await row.locator('button[data-action="retry"]').click()
    await page.locator('#confirm-dialog', { hasText: 'queued again as a new attempt cycle' }).waitFor({ state: 'visible' })
    await shot('job-retry-confirm', false)
    // Escape dismisses: still failed, nothing audited.
    await page.keyboard.press('Escape')
    await page.locator('#confirm-dialog').waitFor({ state: 'hidden' })
    expect((await admin(`/jobs/${held.job_id}?tenant=acme`)).json.state).toBe('failed')
    await row.locator('button[data-action="retry"]').click()
    await page.locator('#confirm-ok').click()
    await page.locator('#job-action-result', { hasText: `Job ${held.job_id}: retry done; it is queued now.` }).waitFor()
    // The screen is filtered on failed: the retried job leaves it.
    await row.waitFor({ state: 'detached' })
    await open('#/jobs?tenant=acme&state=queued')
    await row.locator('td:nth-child(4)', { hasText: 'queued' }).waitFor()
    expect(await row.locator('td').allTextContents().then((c) => c.slice(3, 7))).toEqual(['queued', '—', held.fence, '0'])
    const detail = (await admin(`/jobs/${held.job_id}?tenant=acme`)).json
    expect([detail.state, detail.attempt, detail.error, detail.error_code]).toEqual(['queued', 0, null, null])
    const audit = (await admin(`/audit?tenant=acme&entity=job:${held.job_id}`)).json.items
    expect(audit.filter((a: any) => a.code === 'job_retried').map((a: any) => [a.code, a.caller])).toEqual([['job_retried', 'operator-alice']])
    // A worker claims it again, with a fence above the failed attempt's.
    const again = (await (await jobsApi('/claim', { worker_id: 'worker-a', max: 100 })).json() as { jobs: { job_id: string; fence: string }[] }).jobs.find((j) => j.job_id === held.job_id)
    expect(BigInt(again!.fence)).toBeGreaterThan(BigInt(held.fence))
  })

  it('shows the rules, their versions and a field-by-field diff old → new', async () => {
    expect((await admin('/rules/vip', { method: 'PUT', body: JSON.stringify({ entity_match: 'ticket:vip-*', fence: 'required' }) })).status).toBe(200)
    expect((await admin('/rules/vip', { method: 'PUT', body: JSON.stringify({ entity_match: 'ticket:vip-*', fence: 'optional', tenant: 'acme' }) })).status).toBe(200)
    await open('#/rules')
    await page.locator('#rules-list a', { hasText: 'vip' }).click()
    await page.locator('#rule-diff tbody tr').first().waitFor()
    const diff = await page.locator('#rule-diff tbody tr').evaluateAll((trs) => trs.map((tr) => [...tr.children].map((c) => c.textContent)))
    expect(diff).toEqual([
      ['fence', '"required"', '→', '"optional"'],
      ['tenant', '(absent)', '→', '"acme"'],
    ])
    await shot('rules')
  })

  it('shows an audit-only token its tenant\'s rejections, and no bump or freeze', async () => {
    const auditor = await browser.page()
    await auditor.goto(`${gw.adminUrl}/ui/#/entity/invoice%3A42?tenant=acme`)
    await auditor.locator('#token-dialog').waitFor({ state: 'visible' })
    await auditor.fill('#token-input', await token({ sub: 'auditor-bob', scope: 'fencegate:audit' }))
    await auditor.keyboard.press('Enter')
    await auditor.locator('#entity-actions', { hasText: 'need a token with the fencegate:admin scope' }).waitFor()
    await auditor.locator('#entity-now', { hasText: 'may not read' }).waitFor()
    expect(await auditor.locator('#bump').count()).toBe(0)
    await auditor.goto(`${gw.adminUrl}/ui/#/rejections?entity=invoice%3A42`)
    await auditor.locator('#rejections-table tbody tr').first().waitFor()
    expect(new Set(await auditor.locator('#rejections-table tbody td:nth-child(8)').allTextContents())).toEqual(new Set(['acme']))
    await auditor.close()
  })

  it('shows an agent\'s refused tool call under its MCP rule\'s route name, and the Route filter finds it', async () => {
    const call = { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'create_ticket', arguments: { ticket_id: 'T-9', title: 'printer' } } }
    const res = await fetch(`${gw.url}/mcp`, {
      method: 'POST',
      headers: { ...(await as('agent-d')), 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-11-25' },
      body: JSON.stringify(call),
    })
    const answer = await res.json() as { id: number; error: { data: { code: string } } }
    expect([res.status, answer.id]).toEqual([200, 7])
    const code = answer.error.data.code
    expect(upstream.received.filter((r) => r.path === '/mcp')).toEqual([])
    await open('#/rejections')
    await page.fill('input[name=route]', 'tickets-mcp/create_ticket')
    await page.locator('form.filters button[type=submit]').click()
    await page.waitForFunction(() => location.hash.includes('route=tickets-mcp'))
    await page.locator('#rejections-table tbody tr').first().waitFor()
    const rows = await page.locator('#rejections-table tbody tr').evaluateAll((trs) => trs.map((tr) => [1, 2, 3, 6].map((i) => tr.children[i]!.textContent)))
    expect(rows).toEqual([[code, 'tickets-mcp/create_ticket', 'ticket:T-9', 'agent-d']])
    await shot('rejections-mcp')
  })

  it('is keyboard navigable: the screens are reachable with Tab and Enter', async () => {
    await page.goto(`${gw.adminUrl}/ui/#/rejections`)
    await page.evaluate((t) => sessionStorage.setItem('fencegate.token', t), adminToken)
    // A fresh load: focus starts at the top of the page, the skip link first, then the screens.
    await page.reload()
    await page.locator('#rejections-table tbody tr').first().waitFor()
    await page.keyboard.press('Tab')
    expect(await page.evaluate(() => document.activeElement?.textContent)).toBe('Skip to content')
    for (let i = 0; i < 5 && !(await page.evaluate(() => document.activeElement?.textContent === 'Jobs')); i++) await page.keyboard.press('Tab')
    await page.keyboard.press('Enter')
    await page.waitForFunction(() => location.hash === '#/jobs')
    expect(browser.problems).toEqual([])
  })
})
