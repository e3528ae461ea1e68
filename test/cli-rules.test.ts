import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { stringify } from 'yaml'
import { post } from './helpers/gateway.js'
import { runCli, startGatewayProcess, writeConfig, type GatewayProcess } from './helpers/process.js'
import { closedPort, startUpstream, type TestUpstream } from './helpers/upstream.js'

const tempDir = () => mkdtempSync(join(tmpdir(), 'fencegate-rules-'))

describe('fencegate rules and entities (CLI against a running gateway)', () => {
  let upstream: TestUpstream
  let gateway: GatewayProcess
  const capture = (upstreamUrl: string, extra: Record<string, unknown> = {}) =>
    ({ name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream: upstreamUrl, entity: 'invoice:{params.id}', ...extra })
  const rulesFile = (doc: unknown) => {
    const file = join(tempDir(), 'rules.yaml')
    writeFileSync(file, stringify(doc))
    return file
  }
  const cli = (...args: string[]) => runCli([...args, '--admin-url', gateway.adminUrl])

  beforeAll(async () => {
    upstream = await startUpstream()
    const config = writeConfig({ server: { port: 0, admin_port: 0 }, store: { data_dir: tempDir() }, routes: [capture(upstream.url)] })
    gateway = await startGatewayProcess(['--config', config])
  })
  afterAll(async () => {
    await gateway?.stop()
    await upstream?.close()
  })

  it('describes its subcommands', async () => {
    const rules = await runCli(['rules', '--help'])
    expect(rules.stdout).toContain('list | history <name> | apply -f <file>')
    for (const flag of ['--dry-run', '--prune', '--admin-url', '--token']) expect(rules.stdout).toContain(flag)
    expect((await runCli(['entities', '--help'])).stdout).toContain('bump <entity> --to <fence>')
    expect((await runCli(['rules', 'frobnicate'])).code).toBe(2)
  })

  it('applies a rules file declaratively: dry run, apply, no-op, prune; with history', async () => {
    const file = rulesFile({
      routes: [capture(upstream.url, { timeout_ms: 2500 }), { ...capture(upstream.url), name: 'refund', path: '/refunds/:id' }],
      entity_rules: [{ name: 'freeze-7', entity_match: 'invoice:7', frozen: true }],
    })
    const dry = await cli('rules', 'apply', '-f', file, '--dry-run')
    expect(dry.code, dry.stderr).toBe(0)
    expect(dry.stdout).toContain('~ capture: timeout_ms')
    // Like a plan an operator approves: each changed field with its old and new value.
    expect(dry.stdout).toMatch(/^ {4}timeout_ms: (\d+|\(unset\)) → 2500$/m)
    expect(dry.stdout).toContain('+ refund')
    expect(dry.stdout).toContain('+ freeze-7')
    expect(dry.stdout).toContain('3 change(s) against version 1 (dry run: nothing applied)')
    expect(JSON.parse((await cli('rules', 'list', '--json')).stdout).version).toBe(1)

    const applied = await cli('rules', 'apply', '-f', file)
    expect(applied.code, applied.stderr).toBe(0)
    expect(applied.stdout).toContain('applied: rules are at version 4')
    expect((await post(`${gateway.dataUrl}/refunds/1`, '1')).status).toBe(200)
    expect((await post(`${gateway.dataUrl}/payments/7/capture`, '1')).json.code).toBe('entity_frozen')

    expect((await cli('rules', 'apply', '-f', file)).stdout).toContain('0 change(s) against version 4')
    const list = await cli('rules', 'list')
    expect(list.stdout).toContain('version 4')
    expect(list.stdout).toMatch(/entity +freeze-7\tinvoice:7\tfrozen/)

    const history = await cli('rules', 'history', 'capture')
    expect(history.stdout.trim().split('\n').map((l) => l.split('\t').slice(0, 3).join(' '))).toEqual([
      expect.stringMatching(/^v2 \S+Z api$/), expect.stringMatching(/^v1 \S+Z config$/),
    ])

    const pruned = await cli('rules', 'apply', '-f', rulesFile({ routes: [capture(upstream.url, { timeout_ms: 2500 })] }), '--prune')
    expect(pruned.stdout).toContain('- refund')
    expect(pruned.stdout).toContain('- freeze-7')
    expect((await post(`${gateway.dataUrl}/refunds/1`, '1')).status).toBe(404)
    expect((await post(`${gateway.dataUrl}/payments/7/capture`, '1')).status).toBe(200)
  })

  it('stops with the gateway\'s reasons when it refuses a rule set', async () => {
    // Scopes are fine in a file on their own, but this gateway runs without auth.
    const scoped = rulesFile({ routes: [capture(upstream.url, { timeout_ms: 2500 }), { ...capture(upstream.url), name: 'scoped', path: '/scoped/:id', scopes: ['payments:write'] }] })
    const res = await cli('rules', 'apply', '-f', scoped)
    expect(res.code).toBe(1)
    expect(res.stderr).toContain('stopped at scoped')
    expect(res.stderr).toContain('scopes need auth.mode: jwt')
  })

  it('refuses a malformed rules file before it calls the gateway', async () => {
    const res = await runCli(['rules', 'apply', '-f', rulesFile({ routes: [{ name: 'x', method: 'POST', path: 'no-slash', upstream: 'ftp://x' }] }), '--admin-url', `http://127.0.0.1:${await closedPort()}`])
    expect(res.code).toBe(2)
    expect(res.stderr).toContain('x: path')
    expect(res.stderr).toContain('x: upstream')
    expect((await runCli(['rules', 'apply', '-f', rulesFile({ server: { port: 1 } })])).stderr).toContain('only routes: and entity_rules:')
  })

  it('bumps an entity: lower holders are rejected from then on', async () => {
    expect((await post(`${gateway.dataUrl}/payments/3/capture`, '5')).status).toBe(200)
    const res = await cli('entities', 'bump', 'invoice:3', '--to', '9')
    expect(res.code, res.stderr).toBe(0)
    expect(res.stdout).toContain('invoice:3: fence raised from 5 to 9')
    expect((await post(`${gateway.dataUrl}/payments/3/capture`, '8')).status).toBe(409)
    expect((await cli('entities', 'bump', 'invoice:3', '--to', '2')).stdout).toContain('already at 9; nothing changed')
    const bad = await cli('entities', 'bump', 'invoice:3', '--to', 'ten')
    expect(bad.code).toBe(1)
    expect(bad.stderr).toContain('min_fence')
  })

  it('says so when the admin plane cannot be reached', async () => {
    const res = await runCli(['rules', 'list', '--admin-url', `http://127.0.0.1:${await closedPort()}`])
    expect(res.code).toBe(1)
    expect(res.stderr).toContain('cannot reach the admin plane')
  })
})
