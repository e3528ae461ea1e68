import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { backends, type TestDb } from './helpers/backends.js'
import { post } from './helpers/gateway.js'
import { startGatewayProcess, writeConfig, type GatewayProcess } from './helpers/process.js'
import { gate, startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * A gateway killed in the middle of a request leaves an in-flight record. After
 * idempotency_lock it is an unknown outcome: the duplicate that a client sends
 * to the next gateway is never executed a second time.
 */
describe.each(backends())('a gateway killed mid-request, on $name', (backend) => {
  let t: TestDb | undefined
  let upstream: TestUpstream
  const { opened: held, open: release } = gate()
  const gateways: GatewayProcess[] = []
  let args: string[]

  beforeAll(async () => {
    upstream = await startUpstream(async (_req, res) => {
      await held
      res.end('too late')
    })
    const dataDir = mkdtempSync(join(tmpdir(), 'fencegate-crash-'))
    if (backend.name === 'postgres') t = await backend.open()
    const config = writeConfig({
      server: { port: 0, admin_port: 0 },
      store: { data_dir: dataDir },
      routes: [{
        name: 'capture', method: 'POST', path: '/payments/:id/capture', upstream: upstream.url, entity: 'invoice:{params.id}',
        idempotency: 'required', timeout_ms: 1000, idempotency_lock: '2s',
      }],
    })
    args = ['--config', config, ...(t ? ['--database-url', t.url!] : [])]
  })
  afterAll(async () => {
    release()
    await Promise.all(gateways.map((g) => g.stop()))
    await upstream.close()
    await t?.close()
  })

  it('answers the duplicate with outcome_unknown and never forwards it', async () => {
    const first = await startGatewayProcess(args)
    gateways.push(first)
    const original = post(`${first.dataUrl}/payments/1/capture`, '1', { headers: { 'idempotency-key': 'crash-1' } }).catch((e: unknown) => e)
    await upstream.arrived(1)
    expect(upstream.received).toHaveLength(1)
    first.child.kill('SIGKILL')
    await first.stop()
    expect(await original).toBeInstanceOf(Error)

    const second = await startGatewayProcess(args)
    gateways.push(second)
    // Until the lock ends the record is in progress; then it is an unknown outcome. Poll the answer, bounded.
    let answer = await post(`${second.dataUrl}/payments/1/capture`, '1', { headers: { 'idempotency-key': 'crash-1' } })
    for (let i = 0; i < 100 && answer.status === 409; i++) {
      expect(answer.json.code).toBe('request_in_progress')
      await new Promise((r) => setTimeout(r, 100))
      answer = await post(`${second.dataUrl}/payments/1/capture`, '1', { headers: { 'idempotency-key': 'crash-1' } })
    }
    expect([answer.status, answer.json.code]).toEqual([502, 'outcome_unknown'])
    expect(upstream.received).toHaveLength(1)
  })
})
