import { readdirSync, readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { describe, expect, it } from 'vitest'
import { parseAllDocuments } from 'yaml'
import { createAdminApp } from '../src/admin/app.js'
import { loadConfigText } from '../src/config/text.js'
import type { Config } from '../src/config/schema.js'
import { backends } from './helpers/backends.js'

/**
 * The Dockerfile, the Kubernetes manifests and the systemd unit name only what the gateway
 * serves or reads (docs/deployment.md): probe paths it answers on the port the configuration
 * gives the admin plane, secret files that are mounted with the keys the Secret has, a
 * configuration the real schema accepts, environment variables it reads. No image can be built
 * here (no registry), so this is what keeps them from drifting.
 */
const root = join(import.meta.dirname, '..')
const text = (path: string) => readFileSync(join(root, path), 'utf8')
type Doc = Record<string, any>
const manifests: Doc[] = readdirSync(join(root, 'deploy/kubernetes')).filter((f) => f.endsWith('.yaml'))
  .flatMap((f) => parseAllDocuments(text(`deploy/kubernetes/${f}`)).map((d) => d.toJS() as Doc))
const kind = (k: string) => manifests.find((m) => m.kind === k)!
const deployment = kind('Deployment')
const pod = deployment.spec.template.spec
const container = pod.containers[0]
const secret = kind('Secret')

/** The ConfigMap's fencegate.yaml, its ${file:...} read from the Secret's keys where the pod mounts them. */
function podConfig(): { config: Config; filesRead: string[] } {
  const secretMount = container.volumeMounts.find((m: Doc) => pod.volumes.find((v: Doc) => v.name === m.name)?.secret).mountPath as string
  const filesRead: string[] = []
  const config = loadConfigText(kind('ConfigMap').data['fencegate.yaml'], {}, 'configmap', (file) => {
    filesRead.push(file)
    const key = file.startsWith(`${secretMount}/`) ? file.slice(secretMount.length + 1) : undefined
    if (key === undefined || !(key in secret.stringData)) throw Object.assign(new Error('not mounted'), { code: 'ENOENT' })
    return `${secret.stringData[key]}\n`
  })
  return { config, filesRead }
}

const portOf = (name: string | number) => (typeof name === 'number' ? name : container.ports.find((p: Doc) => p.name === name)?.containerPort)

describe('deploy/kubernetes', () => {
  it('holds a configuration the real schema accepts, every secret file of it mounted from the Secret', () => {
    const { config, filesRead } = podConfig()
    expect(filesRead.length).toBeGreaterThan(0)
    // The kubelet reaches the probes at the pod's address, and off loopback the admin plane needs auth.
    expect([config.server.admin_host, config.auth.mode]).toEqual(['0.0.0.0', 'jwt'])
    expect(config.store.url).toBe(secret.stringData['database-url'])
    const configMount = container.volumeMounts.find((m: Doc) => pod.volumes.find((v: Doc) => v.name === m.name)?.configMap)
    expect(container.args.slice(0, 3)).toEqual(['serve', '--config', configMount.mountPath])
  })

  it('probes paths the admin plane answers without a token, on its port', async () => {
    const { config } = podConfig()
    const t = await backends()[0]!.open()
    const readiness = { draining: () => false, migrationsAtHead: async () => true, rulesLoaded: () => true, durability: () => ({ level: 'local' as const }) }
    // Authentication that refuses everything: a probe must not need it.
    const admin = createAdminApp({ store: t.store, readiness, authenticate: async () => { throw new Error('no token') } })
    for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
      const get = container[probe].httpGet
      expect([probe, portOf(get.port)]).toEqual([probe, config.server.admin_port])
      expect([probe, (await admin.request(get.path)).status]).toEqual([probe, 200])
    }
    expect(container.livenessProbe.httpGet.path).toBe('/livez')
    expect(container.readinessProbe.httpGet.path).toBe('/readyz')
    await t.close()
  })

  it('sends the Service to the data plane\'s port and gives the drain its time', () => {
    const { config } = podConfig()
    expect(kind('Service').spec.ports.map((p: Doc) => portOf(p.targetPort))).toEqual([config.server.port])
    // Past drain_delay and the drain's 10 s grace, with room for the exit.
    expect(pod.terminationGracePeriodSeconds * 1000).toBeGreaterThan(config.server.drain_delay + 10_000)
    expect(kind('PodDisruptionBudget').spec.selector).toEqual(deployment.spec.selector)
  })

  it('runs as a non-root user on a read-only root, the embedded store\'s directory its only writable path', () => {
    const { config } = podConfig()
    expect([pod.securityContext.runAsNonRoot, container.securityContext.readOnlyRootFilesystem]).toEqual([true, true])
    const writable = container.volumeMounts.filter((m: Doc) => !m.readOnly).map((m: Doc) => m.mountPath)
    expect(writable).toEqual([config.store.data_dir])
    expect(container.args).toContain(config.store.data_dir)
  })

  it('names only environment variables the gateway reads', () => {
    const sources = srcFiles(join(root, 'src')).map((f) => readFileSync(f, 'utf8')).join('\n')
    for (const env of container.env ?? []) expect([env.name, sources.includes(`'${env.name}'`) || sources.includes(`env.${env.name}`)]).toEqual([env.name, true])
  })
})

describe('Dockerfile', () => {
  const dockerfile = text('Dockerfile')
  it('installs only dependencies at runtime, and src imports nothing else (Workers aside)', () => {
    expect(dockerfile).toMatch(/npm ci --omit=dev/)
    const deps = new Set(Object.keys(JSON.parse(text('package.json')).dependencies as Record<string, string>))
    const imported = new Set(srcFiles(join(root, 'src')).filter((f) => !f.includes('/runtime/workers/'))
      .flatMap((f) => [...readFileSync(f, 'utf8').matchAll(/^(?:import|export)\b[^'"]*?from '([^.'][^']*)'/gm)].map((m) => m[1]!))
      .filter((s) => !s.startsWith('node:')).map((s) => s.split('/').slice(0, s.startsWith('@') ? 2 : 1).join('/')))
    expect([...imported].filter((p) => !deps.has(p))).toEqual([])
  })

  it('runs serve as a non-root user, checks /livez on the admin port, and matches the Deployment', () => {
    const { config } = podConfig()
    expect(dockerfile).toMatch(/^USER 10001:10001$/m)
    expect(pod.securityContext.runAsUser).toBe(10001)
    const health = /^HEALTHCHECK[\s\S]*?fetch\('http:\/\/127\.0\.0\.1:(\d+)(\/\w+)'\)/m.exec(dockerfile)!
    expect([Number(health[1]), health[2]]).toEqual([config.server.admin_port, '/livez'])
    const cmd = JSON.parse(/^CMD (.*)$/m.exec(dockerfile)![1]!) as string[]
    expect(cmd).toEqual(container.args)
    expect(JSON.parse(/^ENTRYPOINT (.*)$/m.exec(dockerfile)![1]!)).toContain('dist/src/cli/main.js')
    expect(dockerfile).toContain(`VOLUME ["${config.store.data_dir}"]`)
  })
})

describe('deploy/systemd', () => {
  const unit = text('deploy/systemd/fencegate.service')
  it('runs serve with a configuration whose ${file:...} are exactly its LoadCredential= names', () => {
    const credentials = [...unit.matchAll(/^LoadCredential=([^:]+):/gm)].map((m) => m[1]!)
    const read: string[] = []
    const config = loadConfigText(text('deploy/systemd/fencegate.yaml'), { CREDENTIALS_DIRECTORY: '/run/credentials/fencegate.service' }, 'fencegate.yaml', (file) => {
      read.push(file)
      return 'postgres://fencegate@127.0.0.1:5432/fencegate\n'
    })
    expect(read.sort()).toEqual(credentials.map((c) => `/run/credentials/fencegate.service/${c}`).sort())
    const exec = /^ExecStart=(.*)$/m.exec(unit)![1]!.split(' ')
    expect(exec.slice(exec.indexOf('serve'))).toEqual(['serve', '--config', '/etc/fencegate/fencegate.yaml', '--data-dir', config.store.data_dir])
    expect(unit).toMatch(new RegExp(`^StateDirectory=${config.store.data_dir.replace('/var/lib/', '')}$`, 'm'))
    expect(unit).toMatch(/^RestartPreventExitStatus=2$/m)
  })
})

function srcFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const path = join(dir, f)
    return statSync(path).isDirectory() ? srcFiles(path) : path.endsWith('.ts') ? [path] : []
  })
}
