// `npm run bench -- leases --baseline <git-ref>`: the gateway built from another commit,
// run in the same bench beside the current build, to show what a change between them costs
// (issue 30: the identity check, with no switch to turn it off). The ref is checked out
// into a temporary git worktree, which borrows this checkout's node_modules (it is not
// reinstalled: the bench says which of the ref's locked packages this checkout's lock has
// at another version), and is built with tsc; its `fencegate serve` migrates its own database.
import { execFile } from 'node:child_process'
import { existsSync, readFileSync, realpathSync, symlinkSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'

const run = promisify(execFile)

/** The checkout this bench was built from (dist/bench/ → the repository's root). */
export const repositoryRoot = fileURLToPath(new URL('../../', import.meta.url))

export interface Baseline {
  /** The ref as given, for the labels (`http-jwt@4e10a66^`). */
  ref: string
  commit: string
  /** The baseline build's `fencegate` entry point. */
  cli: string
  /** The ref's locked packages that this checkout's lock has at another version, e.g. `@opentelemetry/api 1.10.0 → 1.9.1`. */
  lockDifferences: string[]
  remove(): Promise<void>
}

type Lock = { packages?: Record<string, { version?: string }> }

/**
 * The packages `baseline` locks at a version other than `installed` locks (missing ones
 * included), as `name locked → installed`; packages only `installed` has do not matter,
 * since the baseline's code does not import them. Only `node_modules/…` entries count
 * (the root entry is the project itself).
 *
 * @example
 * lockDifferences({ packages: { 'node_modules/a': { version: '1.1.0' } } }, { packages: { 'node_modules/a': { version: '1.0.0' } } })
 * // → ['a 1.1.0 → 1.0.0']
 */
export function lockDifferences(baseline: Lock, installed: Lock): string[] {
  const out: string[] = []
  for (const [path, entry] of Object.entries(baseline.packages ?? {})) {
    if (!path.startsWith('node_modules/')) continue
    const have = installed.packages?.[path]?.version
    if (have !== entry.version) out.push(`${path.slice('node_modules/'.length)} ${entry.version ?? '?'} → ${have ?? 'not installed'}`)
  }
  return out.sort()
}

/** Checks `ref` out into `dir` (a path that does not exist yet), links node_modules and builds it. */
export async function prepareBaseline(ref: string, dir: string): Promise<Baseline> {
  const git = (args: string[], cwd = repositoryRoot) => run('git', args, { cwd, encoding: 'utf8', maxBuffer: 64 << 20 })
  const commit = (await git(['rev-parse', '--verify', '--end-of-options', `${ref}^{commit}`])).stdout.trim()
  await git(['worktree', 'add', '--detach', dir, commit])
  const remove = async () => {
    await git(['worktree', 'remove', '--force', dir]).catch(async () => git(['worktree', 'prune']))
  }
  try {
    const modules = realpathSync(join(repositoryRoot, 'node_modules'))
    symlinkSync(modules, join(dir, 'node_modules'), 'dir')
    // Against this checkout's lock, not node_modules/.package-lock.json: that one leaves out
    // the optional packages of other platforms, which would all read as differences.
    const installed = JSON.parse(readFileSync(join(repositoryRoot, 'package-lock.json'), 'utf8')) as Lock
    const locked = JSON.parse(readFileSync(join(dir, 'package-lock.json'), 'utf8')) as Lock
    // The UI build is not needed: the job API is all the lease bench calls.
    await run(process.execPath, [join(modules, 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.build.json'], { cwd: dir, maxBuffer: 64 << 20 })
      .catch((err: { stdout?: string; message: string }) => {
        throw new Error(`--baseline ${ref}: tsc failed in ${dir}:\n${err.stdout?.slice(-4000) ?? err.message}`)
      })
    const cli = join(dir, 'dist', 'src', 'cli', 'main.js')
    if (!existsSync(cli)) throw new Error(`--baseline ${ref}: the build has no ${cli}`)
    return { ref, commit, cli, lockDifferences: lockDifferences(locked, installed), remove }
  } catch (err) {
    await remove()
    throw err
  }
}

/** What the comparison needs of a measured phase (bench/leases.ts). */
export interface MeasuredPhase {
  round: number
  regime: string
  system: string
  jobs: number
  seconds: number
  cpu: { gateway: number }
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2
}

/**
 * For each `[current, baseline]` system pair and regime: the current build's jobs/s and
 * gateway CPU µs per job over the baseline's, each ratio taken within a round (the machine's
 * speed moves between rounds, and both ran in the same one), then the median over rounds.
 *
 * @example
 * baselineRatios(phases, [['http-jwt', 'http-jwt@4e10a66^']])
 * // → [{ regime: 'depth 1000', current: 'http-jwt', baseline: 'http-jwt@4e10a66^', rounds: 3, jobsPerSecond: 0.99, gatewayCpu: 1.02 }]
 */
export function baselineRatios(phases: MeasuredPhase[], pairs: [string, string][]) {
  const out: { regime: string; current: string; baseline: string; rounds: number; jobsPerSecond: number; gatewayCpu: number }[] = []
  for (const regime of [...new Set(phases.map((p) => p.regime))]) {
    for (const [current, baseline] of pairs) {
      const rates: number[] = []
      const cpus: number[] = []
      for (const round of [...new Set(phases.map((p) => p.round))]) {
        const find = (system: string) => phases.find((p) => p.round === round && p.regime === regime && p.system === system)
        const [c, b] = [find(current), find(baseline)]
        if (!c || !b) continue
        rates.push((c.jobs / c.seconds) / (b.jobs / b.seconds))
        if (b.cpu.gateway > 0) cpus.push((c.cpu.gateway / c.jobs) / (b.cpu.gateway / b.jobs))
      }
      if (rates.length) out.push({ regime, current, baseline, rounds: rates.length, jobsPerSecond: median(rates), gatewayCpu: cpus.length ? median(cpus) : NaN })
    }
  }
  return out
}
