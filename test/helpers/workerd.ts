import { execFile } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync } from 'node:fs'
import { basename, join, relative } from 'node:path'
import type { Readable } from 'node:stream'
import { promisify } from 'node:util'
import { Miniflare } from 'miniflare'

const root = join(import.meta.dirname, '..', '..')

/** The Worker as `wrangler deploy` would upload it: one ES module, and the names it exports. */
export interface WorkerBundle {
  /** The bundled main module's text. */
  contents: string
  /** The main module's export names, from esbuild's metafile. */
  exports: string[]
  /** The directory holding it (entry.js, meta.json). */
  dir: string
}

/** The wrangler.toml settings the runtime is started with. */
export function wranglerSettings(): { main: string; compatibilityDate: string; compatibilityFlags: string[] } {
  const toml = readFileSync(join(root, 'wrangler.toml'), 'utf8')
  const field = (name: string) => new RegExp(`^${name} = (.*)$`, 'm').exec(toml)?.[1]
  return {
    main: JSON.parse(field('main')!) as string,
    compatibilityDate: JSON.parse(field('compatibility_date')!) as string,
    compatibilityFlags: JSON.parse(field('compatibility_flags')!) as string[],
  }
}

function filesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    return statSync(path).isDirectory() ? filesUnder(path) : [path]
  })
}

let bundled: Promise<WorkerBundle> | undefined

/**
 * Bundles the Worker with wrangler itself (`wrangler deploy --dry-run`, which
 * bundles offline and uploads nothing), so the tests run what a deploy would.
 * The bundle is kept under node_modules/.cache, keyed by the sources, the
 * lockfile and wrangler.toml, so test files running one after another bundle once.
 */
export function bundleWorker(): Promise<WorkerBundle> {
  bundled ??= (async () => {
    const hash = createHash('sha256')
    for (const file of [...filesUnder(join(root, 'src')).sort(), join(root, 'wrangler.toml'), join(root, 'package-lock.json')]) {
      hash.update(relative(root, file)).update('\0').update(readFileSync(file)).update('\0')
    }
    const cache = join(root, 'node_modules', '.cache', 'fencegate-worker')
    const dir = join(cache, hash.digest('hex').slice(0, 16))
    try {
      return readBundle(dir)
    } catch {
      // Not cached yet: bundle into a private directory, then move it into place whole.
      const scratch = `${dir}.${process.pid}`
      mkdirSync(scratch, { recursive: true })
      await promisify(execFile)(process.execPath, [
        join(root, 'node_modules', 'wrangler', 'bin', 'wrangler.js'), 'deploy', '--dry-run',
        '--outdir', scratch, '--metafile', join(scratch, 'meta.json'), '--config', join(root, 'wrangler.toml'),
      ], { cwd: root, env: { ...process.env, WRANGLER_SEND_METRICS: 'false', CI: '1', NO_COLOR: '1' } })
      // Older bundles go (finished ones only: a name with a dot is another file's scratch).
      for (const name of readdirSync(cache)) if (!name.includes('.') && name !== basename(dir)) rmSync(join(cache, name), { recursive: true, force: true })
      try {
        renameSync(scratch, dir)
      } catch {
        // Another test file put the same bundle there first.
        rmSync(scratch, { recursive: true, force: true })
      }
      return readBundle(dir)
    }
  })()
  return bundled
}

function readBundle(dir: string): WorkerBundle {
  const meta = JSON.parse(readFileSync(join(dir, 'meta.json'), 'utf8')) as { outputs: Record<string, { entryPoint?: string; exports: string[] }> }
  const [output, info] = Object.entries(meta.outputs).find(([, o]) => o.entryPoint === wranglerSettings().main)!
  // Named by where wrangler wrote it; the directory has moved since.
  const file = join(dir, basename(output))
  return { contents: readFileSync(file, 'utf8'), exports: info.exports, dir }
}

/** One Worker of a workerd instance: a name and its bindings (vars and secrets). */
export interface WorkerSpec {
  name: string
  bindings: Record<string, string>
  /** Hyperdrive bindings and the database each stands for (wrangler's `localConnectionString`). */
  hyperdrives?: Record<string, string>
}

/**
 * Starts workerd through Miniflare with the bundle as every worker's main
 * module and wrangler.toml's compatibility settings. The first worker answers
 * `mf.dispatchFetch`; the others are reached with `mf.getWorker(name)`.
 */
export async function startWorkerd(bundle: Pick<WorkerBundle, 'contents'>, workers: WorkerSpec[], options: { onStderr?: (text: string) => void } = {}): Promise<Miniflare> {
  const { compatibilityDate, compatibilityFlags } = wranglerSettings()
  const { onStderr } = options
  const mf = new Miniflare({
    ...(onStderr ? {
      handleRuntimeStdio(stdout: Readable, stderr: Readable) {
        stdout.resume()
        stderr.setEncoding('utf8').on('data', onStderr)
      },
    } : {}),
    workers: workers.map((w) => ({
      name: w.name,
      modules: [{ type: 'ESModule' as const, path: 'entry.js', contents: bundle.contents }],
      compatibilityDate,
      compatibilityFlags,
      bindings: w.bindings,
      ...(w.hyperdrives ? { hyperdrives: w.hyperdrives } : {}),
    })),
  })
  await mf.ready
  return mf
}

/** What the tests call on one worker of a workerd instance (Miniflare types it with workers-types, not installed here). */
export interface WorkerHandle {
  fetch(url: string, init?: RequestInit): Promise<Response>
  scheduled(options?: { cron?: string; scheduledTime?: Date }): Promise<{ outcome: string; noRetry: boolean }>
}

/** A worker of a running workerd instance by name (the first when none is given). */
export async function workerOf(mf: Miniflare, name?: string): Promise<WorkerHandle> {
  return (await mf.getWorker(name)) as unknown as WorkerHandle
}
