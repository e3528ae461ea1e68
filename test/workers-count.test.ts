import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { ConfigError } from '../src/config/schema.js'
import { cgroupCpus, readCpuMax, workerCount, workerPool, type CpuHost } from '../src/runtime/node/workers.js'

// A host of `cpus` CPUs whose cgroup says `cpuMax` (undefined: no cpu.max file).
const host = (cpus: number, cpuMax: string | undefined): CpuHost => ({ cpuMax: () => cpuMax, cpus: () => cpus })

describe('cgroupCpus', () => {
  it('reads a cgroup v2 cpu.max as whole CPUs, a fraction rounded up', () => {
    expect(cgroupCpus('200000 100000\n')).toBe(2)
    // 1.5 CPUs: a second worker can use the half, so it rounds up.
    expect(cgroupCpus('150000 100000')).toBe(2)
    expect(cgroupCpus('50000 100000')).toBe(1)
  })

  it('is no limit for max, a missing file, or text it cannot read', () => {
    expect(cgroupCpus('max 100000\n')).toBeUndefined()
    expect(cgroupCpus(undefined)).toBeUndefined()
    expect(cgroupCpus('')).toBeUndefined()
    expect(cgroupCpus('200000')).toBeUndefined()
    expect(cgroupCpus('lots 100000')).toBeUndefined()
  })
})

describe('workerCount', () => {
  it('returns a number setting as it is, without reading the host', () => {
    const untouchable: CpuHost = { cpuMax: () => expect.unreachable('cpu.max read'), cpus: () => expect.unreachable('cpus read') }
    expect(workerCount(3, untouchable)).toBe(3)
  })

  it('auto: the CPUs of the affinity without a cgroup limit', () => {
    expect(workerCount('auto', host(8, 'max 100000\n'))).toBe(8)
    expect(workerCount('auto', host(8, undefined))).toBe(8)
  })

  it('auto: a cgroup limit below the affinity caps it, rounded up', () => {
    expect(workerCount('auto', host(32, '200000 100000\n'))).toBe(2)
    expect(workerCount('auto', host(32, '150000 100000\n'))).toBe(2)
    expect(workerCount('auto', host(32, '50000 100000\n'))).toBe(1)
  })

  it('auto: a limit above the affinity does not raise it', () => {
    expect(workerCount('auto', host(2, '800000 100000\n'))).toBe(2)
  })
})

describe('readCpuMax', () => {
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-cpu-max-'))
  afterAll(() => rmSync(dir, { recursive: true, force: true }))

  it('reads the file, and a missing one is undefined (no limit), not an error', () => {
    const file = join(dir, 'cpu.max')
    writeFileSync(file, '150000 100000\n')
    expect(readCpuMax(file)).toBe('150000 100000\n')
    expect(cgroupCpus(readCpuMax(file))).toBe(2)
    expect(readCpuMax(join(dir, 'absent', 'cpu.max'))).toBeUndefined()
  })
})

describe('workerPool', () => {
  it('splits store.max_connections: each worker its statements and one LISTEN connection', () => {
    expect(workerPool(20, 1)).toBe(19)
    expect(workerPool(20, 4)).toBe(4)
    // The remainder is left unused rather than exceed the total.
    expect(workerPool(21, 4)).toBe(4)
    expect(workerPool(42, 2)).toBe(20)
  })

  it('refuses a budget that leaves a worker no statement connection, naming server.workers', () => {
    expect(workerPool(8, 4)).toBe(1)
    expect(() => workerPool(7, 4)).toThrow(ConfigError)
    expect(() => workerPool(7, 4)).toThrow(/server\.workers: 4 workers need store\.max_connections of at least 8/)
  })
})
