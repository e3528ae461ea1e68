import { spawn, type ChildProcess } from 'node:child_process'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { stringify } from 'yaml'

/** The built CLI; `npm test` builds it first (pretest). From dist/test/helpers (the faults bench) it is a sibling tree. */
export const cli = join(import.meta.dirname, import.meta.dirname.includes('/dist/test/') ? '../../src/cli/main.js' : '../../dist/src/cli/main.js')

// Every directory tempDir made, removed when the test process exits (by then each gateway
// using one has stopped): runs left hundreds of config and data directories in /tmp.
const made: string[] = []
process.once('exit', () => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true })
})

/**
 * A fresh directory under the run's temporary directory (made by test/helpers/global-setup.ts,
 * removed at the end of the run; the system's temp dir outside vitest), removed when the test
 * process exits too.
 */
export function tempDir(prefix: string): string {
  const dir = mkdtempSync(join(process.env.FENCEGATE_TEST_TMP ?? tmpdir(), prefix))
  made.push(dir)
  return dir
}

/**
 * Writes a configuration file for a gateway process. `server.drain_delay` is 0 unless the
 * config sets it: a test that stops its gateways with SIGTERM is not about the drain, and
 * would otherwise wait the 5 s default for load balancers it does not have.
 */
export function writeConfig(config: Record<string, unknown>): string {
  const dir = tempDir('fencegate-test-')
  const file = join(dir, 'fencegate.yaml')
  const server = { drain_delay: 0, ...(config.server as Record<string, unknown> | undefined) }
  writeFileSync(file, stringify({ ...config, server }))
  return file
}

export interface CliResult {
  code: number | null
  stdout: string
  stderr: string
}

/** Runs the CLI to completion. */
export function runCli(args: string[], env: Record<string, string | undefined> = {}): Promise<CliResult> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [cli, ...args], { env: { ...process.env, DATABASE_URL: undefined, ...env } })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (c: Buffer) => (stdout += c))
    child.stderr.on('data', (c: Buffer) => (stderr += c))
    child.on('close', (code) => resolve({ code, stdout, stderr }))
  })
}

export interface GatewayProcess {
  child: ChildProcess
  dataUrl: string
  adminUrl: string
  /** Every log line printed so far. */
  lines: string[]
  stop(): Promise<number | null>
}

/** Starts `fencegate serve` and resolves once it logs `listening` with its URLs. */
export function startGatewayProcess(args: string[], env: Record<string, string | undefined> = {}): Promise<GatewayProcess> {
  return untilListening(spawn(process.execPath, [cli, 'serve', ...args], { env: { ...process.env, DATABASE_URL: undefined, ...env } }))
}

/**
 * A gateway process started some other way (as another user, in a namespace): resolves once it
 * logs `listening` with its URLs, and rejects with its stderr if it exits first.
 *
 * @example
 * const gw = await untilListening(spawn('setpriv', ['--reuid=10001', ..., 'node', cli, 'serve']))
 */
export function untilListening(child: ChildProcess): Promise<GatewayProcess> {
  return new Promise((resolve, reject) => {
    const lines: string[] = []
    let buffered = ''
    let stderr = ''
    child.stderr!.on('data', (c: Buffer) => (stderr += c))
    child.on('exit', (code) => reject(new Error(`gateway exited with ${code}: ${stderr}`)))
    child.stdout!.on('data', (c: Buffer) => {
      buffered += c
      let nl
      while ((nl = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, nl)
        buffered = buffered.slice(nl + 1)
        lines.push(line)
        const event = JSON.parse(line) as { event: string; data_url?: string; admin_url?: string }
        if (event.event === 'listening') {
          resolve({
            child,
            dataUrl: event.data_url!,
            adminUrl: event.admin_url!,
            lines,
            stop: () => new Promise((done) => {
              if (child.exitCode !== null || child.signalCode !== null) return done(child.exitCode)
              child.once('exit', (code) => done(code))
              child.kill('SIGTERM')
            }),
          })
        }
      }
    })
  })
}

/**
 * Starts a gateway per argument list, all at once. If any fails to start, the ones that
 * did are stopped before the failure is thrown: a test that fails there must not leave a
 * gateway running (one did, for an hour, after a failed start of its sibling).
 */
export async function startGatewayProcesses(argLists: string[][]): Promise<GatewayProcess[]> {
  const started = await Promise.allSettled(argLists.map((args) => startGatewayProcess(args)))
  const failed = started.find((s): s is PromiseRejectedResult => s.status === 'rejected')
  if (failed) {
    await Promise.all(started.map((s) => (s.status === 'fulfilled' ? s.value.stop() : undefined)))
    throw failed.reason
  }
  return started.map((s) => (s as PromiseFulfilledResult<GatewayProcess>).value)
}

/**
 * One sample of a metric from a gateway's `GET /metrics` (the first series of that name), NaN
 * when it has none.
 *
 * @example
 * expect(await metric(gw, 'fencegate_job_listen_active')).toBe(1)
 */
export async function metric(gw: GatewayProcess, name: string): Promise<number> {
  const text = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  const line = text.split('\n').find((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`))
  return line ? Number(line.split(' ').at(-1)) : Number.NaN
}
