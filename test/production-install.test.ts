import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process'
import { chmodSync, chownSync, copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { stringify } from 'yaml'
import { post, route } from './helpers/gateway.js'
import { untilListening } from './helpers/process.js'
import { startUpstream, type TestUpstream } from './helpers/upstream.js'

/**
 * The Dockerfile's runtime stage without an image (no registry is reachable here): its
 * production install (`npm ci --omit=dev`, the build's `dist`, `migrations`) in a directory
 * of its own, then its ENTRYPOINT and CMD as its USER, with the root filesystem read-only
 * (a mount namespace of the process's own, as `docker run --read-only` gives) and the
 * store's directory the one writable path. Needs root (for the namespace and the user
 * switch), util-linux's unshare and setpriv, and npm (offline from its cache when it can).
 */
const repo = join(import.meta.dirname, '..')
const dockerfile = readFileSync(join(repo, 'Dockerfile'), 'utf8')
const tools = ['unshare', 'setpriv', 'npm'].filter((t) => spawnSync('sh', ['-c', `command -v ${t}`]).status !== 0)
const why = process.getuid?.() !== 0 ? 'needs root' : tools.length > 0 ? `needs ${tools.join(', ')}` : !existsSync(join(repo, 'dist/src/cli/main.js')) ? 'needs npm run build' : undefined
if (why) console.warn(`the Dockerfile's production install as an unprivileged user: skipped (${why})`)

/** The runtime stage's instruction `name` (the last one), as written. */
const instruction = (name: string) => [...dockerfile.matchAll(new RegExp(`^${name} (.*)$`, 'gm'))].at(-1)![1]!
const user = instruction('USER').split(':').map(Number) as [number, number]
// In the image, /app is the WORKDIR and these are the volume and the mounted configuration.
const imagePaths = { app: instruction('WORKDIR'), store: '/var/lib/fencegate', config: '/etc/fencegate' }

/**
 * The image's command (ENTRYPOINT + CMD, `node` being a copy of this Node, the image's paths this
 * directory's) as `user`, under a read-only root but for `store`.
 */
function runAsInImage(app: string, store: string, config: string): ChildProcess {
  // The image's node is its own, readable by its user; this Node may live where that user
  // cannot read (CI's newer lines are under /root/.cache), so a copy beside the app stands in.
  const node = join(app, '..', 'node')
  const command = [...JSON.parse(instruction('ENTRYPOINT')) as string[], ...JSON.parse(instruction('CMD')) as string[]]
    .map((arg) => arg === 'node' ? node : arg.replace(imagePaths.store, store).replace(imagePaths.config, config))
  // unshare and sh exec: the pid spawned is the gateway's, and SIGTERM reaches it as it would PID 1.
  const script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro / && cd "$2" && shift 2 && exec "$@"'
  return spawn('unshare', ['--mount', 'sh', '-c', script, 'sh', store, app,
    'setpriv', `--reuid=${user[0]}`, `--regid=${user[1]}`, '--clear-groups', 'env', '-i', 'HOME=/nonexistent', 'NODE_ENV=production', ...command])
}

describe.skipIf(why !== undefined)('the Dockerfile\'s production install, as its user on a read-only root', () => {
  let dir: string
  let app: string
  let upstream: TestUpstream

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'fencegate-image-'))
    chmodSync(dir, 0o755)
    copyFileSync(process.execPath, join(dir, 'node'))
    chmodSync(join(dir, 'node'), 0o755)
    app = join(dir, 'app')
    mkdirSync(app)
    for (const f of ['package.json', 'package-lock.json', 'fencegate.example.yaml']) cpSync(join(repo, f), join(app, f))
    // The runtime stage's RUN: only `dependencies`, no scripts (`prepare` would build).
    execFileSync('npm', ['ci', '--omit=dev', '--no-audit', '--no-fund', '--ignore-scripts', '--prefer-offline'], { cwd: app, stdio: 'ignore' })
    cpSync(join(repo, 'dist'), join(app, 'dist'), { recursive: true })
    cpSync(join(repo, 'migrations'), join(app, 'migrations'), { recursive: true })
    upstream = await startUpstream((_req, res) => {
      res.end('{"ok":true}')
    })
    mkdirSync(join(dir, 'etc'))
    writeFileSync(join(dir, 'etc', 'fencegate.yaml'), stringify({ server: { port: 0, admin_port: 0, drain_delay: 0 }, routes: [route(upstream.url)] }))
  }, 300_000)

  afterAll(async () => {
    await upstream?.close()
    if (dir) rmSync(dir, { recursive: true, force: true })
  })

  it('serves, writing only the store\'s directory, and drains on SIGTERM', async () => {
    const store = join(dir, 'store')
    mkdirSync(store)
    chownSync(store, ...user)
    const gw = await untilListening(runAsInImage(app, store, join(dir, 'etc')))
    expect(readFileSync(`/proc/${gw.child.pid}/status`, 'utf8')).toMatch(new RegExp(`^Uid:\\t${user[0]}\\t`, 'm'))
    expect((await fetch(`${gw.adminUrl}/livez`)).status).toBe(200)
    expect((await fetch(`${gw.adminUrl}/readyz`)).status).toBe(200)
    expect((await post(`${gw.dataUrl}/payments/1/capture`, '1')).status).toBe(200)
    // The embedded store is in the directory, as the image's user's.
    expect(readdirSync(store).length).toBeGreaterThan(0)
    expect(statSync(join(store, readdirSync(store)[0]!)).uid).toBe(user[0])
    const exit = new Promise<number | null>((resolve) => gw.child.once('exit', resolve))
    gw.child.kill('SIGTERM')
    expect(await exit).toBe(0)
  })

  it('stops at start, naming the path, when the store\'s directory is not the user\'s', async () => {
    const store = join(dir, 'store-root-owned')
    mkdirSync(store)
    const started = untilListening(runAsInImage(app, store, join(dir, 'etc')))
    await expect(started).rejects.toThrow(/exited with [1-9]/)
    await expect(started).rejects.toThrow(`EACCES: permission denied, open '${store}/`)
  })
})
