// `npm run bench -- leases`: what its options refuse, and how --baseline compares the
// other build's rows with this build's (docs/benchmarks.md, the leases section).
import { describe, expect, it } from 'vitest'
import { baselineRatios, lockDifferences, type MeasuredPhase } from '../bench/lease-baseline.js'
import { parseLeaseOptions } from '../bench/lease-options.js'

describe('bench leases options', () => {
  it('takes --baseline as a git ref, and without it runs no other build', () => {
    expect(parseLeaseOptions(['--systems', 'http,http-jwt', '--baseline', '4e10a66^'])?.baseline).toBe('4e10a66^')
    expect(parseLeaseOptions(['--systems', 'http-jwt'])?.baseline).toBeUndefined()
  })

  it.each([
    [['--baseline', ''], /--baseline must be a git ref/],
    [['--baseline=--upload-pack=x'], /--baseline must be a git ref/],
    [['--systems', 'store,graphile', '--baseline', 'main'], /--systems has neither/],
    [['--systems', 'http,nope'], /unknown system "nope"/],
  ])('refuses %j, naming the option', (argv, message) => {
    expect(() => parseLeaseOptions(argv)).toThrow(message)
  })
})

const phase = (round: number, system: string, seconds: number, gateway: number, regime = 'depth 1000'): MeasuredPhase => ({ round, regime, system, jobs: 1000, seconds, cpu: { gateway } })

describe('bench leases --baseline', () => {
  it('takes each ratio within a round, then the median over rounds', () => {
    // The machine slows down in round 2 for both builds; within every round this build is at
    // 90%, 90%, 50% of the baseline's jobs/s, so the median is 90%. The ratio of the medians
    // of jobs/s (1000/1.25 over 1000/1) would say 80%.
    const phases = [
      phase(1, 'cur', 1 / 0.9, 1.1), phase(1, 'base', 1, 1),
      phase(2, 'cur', 4 / 0.9, 4.4), phase(2, 'base', 4, 4),
      phase(3, 'cur', 1.25 / 0.5, 2.5), phase(3, 'base', 1.25, 1),
    ]
    const [r] = baselineRatios(phases, [['cur', 'base']])
    expect(r).toMatchObject({ regime: 'depth 1000', current: 'cur', baseline: 'base', rounds: 3 })
    expect(r!.jobsPerSecond).toBeCloseTo(0.9)
    expect(r!.gatewayCpu).toBeCloseTo(1.1)
  })

  it('pairs rows by regime and skips a round one of the two did not run in', () => {
    const phases = [phase(1, 'cur', 1, 1), phase(1, 'base', 2, 1), phase(2, 'cur', 1, 1), phase(1, 'cur', 1, 1, 'steady'), phase(1, 'base', 1, 2, 'steady')]
    expect(baselineRatios(phases, [['cur', 'base']]).map((r) => [r.regime, r.rounds, r.jobsPerSecond, r.gatewayCpu])).toEqual([
      ['depth 1000', 1, 2, 1],
      ['steady', 1, 1, 0.5],
    ])
  })

  it('names the packages the ref locks at another version than this checkout, not those only this checkout has', () => {
    const ref = { packages: { '': { version: '0.1.0' }, 'node_modules/a': { version: '1.1.0' }, 'node_modules/b': { version: '2.0.0' }, 'node_modules/gone': { version: '3.0.0' } } }
    const here = { packages: { '': { version: '0.2.0' }, 'node_modules/a': { version: '1.0.0' }, 'node_modules/b': { version: '2.0.0' }, 'node_modules/new': { version: '1.0.0' } } }
    expect(lockDifferences(ref, here)).toEqual(['a 1.1.0 → 1.0.0', 'gone 3.0.0 → not installed'])
    expect(lockDifferences(here, here)).toEqual([])
  })
})
