import { spawn } from 'node:child_process'
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { openDb } from '../src/runtime/node/gateway.js'
import { createStore } from '../src/store/store.js'
import { post } from './helpers/gateway.js'
import { cli, runCli, startGatewayProcess, writeConfig, type GatewayProcess } from './helpers/process.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

const tempDir = () => mkdtempSync(join(tmpdir(), 'fencegate-cli-audit-'))

describe('fencegate audit --format and --follow', () => {
  it('exports the embedded store\'s audit trail as CSV and NDJSON', async () => {
    const dir = tempDir()
    const store = createStore(await openDb(undefined, dir))
    const traceId = '4bf92f3577b34da6a3ce929d0e0e4736'
    for (const id of ['a-1', 'a-2', 'a-3']) {
      await store.recordRejection({ tenant: 'default', route: 'capture', entity: 'invoice:9', code: 'invalid_fence', presentedFence: null, highestFence: null,
        method: 'POST', path: '/payments/9/capture', bodySha256: null, caller: 'w, "quoted"', requestId: id, traceId: id === 'a-2' ? traceId : null })
    }
    await store.close()
    const csv = await runCli(['audit', '--data-dir', dir, '--format', 'csv'])
    expect(csv.code).toBe(0)
    const lines = csv.stdout.split('\r\n')
    expect(lines[0]).toBe('id,at,tenant,route,entity,code,presented_fence,highest_fence,method,path,body_sha256,caller,request_id,idempotency_key,trace_id,trace_from_caller')
    expect(lines.slice(1, 4).map((l) => l.split(',').slice(-4))).toEqual([['a-3', '', '', ''], ['a-2', '', traceId, 'false'], ['a-1', '', '', '']])
    expect(lines[1]).toContain('"w, ""quoted"""')
    const ndjson = await runCli(['audit', '--data-dir', dir, '--format', 'ndjson', '--limit', '2'])
    expect(ndjson.stdout.trim().split('\n').map((l) => JSON.parse(l).request_id)).toEqual(['a-3', 'a-2'])
    const bad = await runCli(['audit', '--data-dir', dir, '--format', 'xml'])
    expect([bad.code, bad.stderr.includes('--format')]).toEqual([2, true])
  })

  it('--trace-id reads the rows of one trace, and the table shows each row\'s trace', async () => {
    const dir = tempDir()
    const store = createStore(await openDb(undefined, dir))
    const traceId = '4bf92f3577b34da6a3ce929d0e0e4736'
    // t-3's trace id came from its caller's traceparent (traceIdOf marks it so).
    for (const [id, trace] of [['t-1', null], ['t-2', traceId], ['t-3', `caller:${traceId}`]] as const) {
      await store.recordRejection({ tenant: 'default', route: 'capture', entity: 'invoice:9', code: 'stale_fence', presentedFence: '1', highestFence: '2',
        method: 'POST', path: '/payments/9/capture', bodySha256: null, caller: 'w', requestId: id, traceId: trace })
    }
    await store.close()
    const table = await runCli(['audit', '--data-dir', dir, '--trace-id', traceId])
    expect(table.stdout.trim().split('\n').map((l) => l.split('\t').slice(-3))).toEqual([
      ['request', 'trace', 'trace_from'], ['POST /payments/9/capture t-3', traceId, 'caller'], ['POST /payments/9/capture t-2', traceId, 'gateway'],
    ])
    const all = await runCli(['audit', '--data-dir', dir])
    expect(all.stdout.trim().split('\n').at(-1)!.split('\t').slice(-2)).toEqual(['-', '-'])
    // Checked before the store is opened, as the admin plane checks it.
    const notTrace = await runCli(['audit', '--data-dir', dir, '--trace-id', traceId.toUpperCase()])
    expect([notTrace.code, /--trace-id must be a trace id/.test(notTrace.stderr)]).toEqual([2, true])
  })

  describe('against a running gateway', () => {
    let upstream: TestUpstream
    let gateway: GatewayProcess
    beforeAll(async () => {
      upstream = await startUpstream()
      const config = writeConfig({
        server: { port: 0, admin_port: 0 },
        store: { data_dir: tempDir() },
        routes: [{ name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream: upstream.url, entity: 'invoice:{params.id}' }],
      })
      gateway = await startGatewayProcess(['--config', config])
    })
    afterAll(async () => {
      await gateway?.stop()
      await upstream?.close()
    })

    it('exports CSV from the admin plane', async () => {
      await post(`${gateway.dataUrl}/payments/1/capture`, 'x', { headers: { 'x-request-id': 'csv-1' } })
      const res = await runCli(['audit', '--admin-url', gateway.adminUrl, '--format', 'csv', '--entity', 'invoice:1'])
      expect(res.code).toBe(0)
      expect(res.stdout.split('\r\n')[1]).toContain('csv-1')
    })

    it('--follow prints rejections recorded after it started, oldest first, until interrupted', async () => {
      await post(`${gateway.dataUrl}/payments/2/capture`, 'x', { headers: { 'x-request-id': 'before' } })
      const child = spawn(process.execPath, [cli, 'audit', '--follow', '--every', '100ms', '--limit', '1', '--format', 'ndjson', '--entity', 'invoice:2', '--admin-url', gateway.adminUrl])
      const seen: string[] = []
      let buffered = ''
      const waiters: Array<() => void> = []
      child.stdout.on('data', (c: Buffer) => {
        buffered += c
        const lines = buffered.split('\n')
        buffered = lines.pop()!
        seen.push(...lines.map((l) => JSON.parse(l).request_id as string))
        for (const w of waiters.splice(0)) w()
      })
      const until = async (n: number) => {
        while (seen.length < n) await new Promise<void>((resolve) => waiters.push(resolve))
      }
      await until(1)
      expect(seen).toEqual(['before'])
      for (const id of ['f-1', 'f-2', 'f-3']) await post(`${gateway.dataUrl}/payments/2/capture`, 'x', { headers: { 'x-request-id': id } })
      await post(`${gateway.dataUrl}/payments/3/capture`, 'x', { headers: { 'x-request-id': 'other-entity' } })
      await until(4)
      const exited = new Promise<number | null>((resolve) => child.on('close', resolve))
      child.kill('SIGINT')
      expect(await exited).toBe(0)
      expect(seen).toEqual(['before', 'f-1', 'f-2', 'f-3'])
    })
  })
})
