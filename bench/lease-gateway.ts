// The gateways `npm run bench -- leases` calls over HTTP: one without auth, and for
// `http-jwt` one under `auth.mode: jwt`, where every call carries a token and the job API
// checks its scope and that the worker is the token's `sub` (issue 30). Both on the same
// database; the systems run one after another.
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { SignJWT } from 'jose'
import { freePort, isHealthy, startChild, stopChild, waitUntil, type Child } from './procs.js'
import type { BenchStore } from './fresh-db.js'

const issuer = 'https://bench.fencegate.invalid'
const audience = 'fencegate-bench'
// A bench-only secret for a gateway on loopback that lives as long as the run.
const secret = 'fencegate-bench-hs256-secret-of-32-bytes'

export interface LeaseGateway {
  port: number
  child: Child
  stop(): Promise<void>
}

/** This checkout's build of `fencegate`. */
export const currentCli = new URL('../src/cli/main.js', import.meta.url)

/**
 * Starts `fencegate serve` for the job API, with `maxConnections` to the store; `jwt` adds
 * auth. `build` is another build's entry point and its name (`--baseline`), started with
 * the same config and verifying the same tokens.
 */
export async function startLeaseGateway(dir: string, store: BenchStore, maxConnections: number, config: { routes: unknown[]; job_types: unknown[] }, jwt: boolean, build: { cli: URL; name: string } = { cli: currentCli, name: 'current' }): Promise<LeaseGateway> {
  const [port, adminPort] = [await freePort(), await freePort()]
  const name = `${jwt ? 'gateway-jwt' : 'gateway'}${build.cli === currentCli ? '' : `-${build.name}`}`
  const configFile = join(dir, `${name}.leases.yaml`)
  writeFileSync(configFile, JSON.stringify({
    server: { host: '127.0.0.1', port, admin_host: '127.0.0.1', admin_port: adminPort }, log: { level: 'warn' },
    store: { max_connections: maxConnections }, ...config,
    ...(jwt ? { auth: { mode: 'jwt', issuer, audience, hs256_secret: secret } } : {}),
  }))
  const child = startChild(name, build.cli, ['serve', '--config', configFile], { ...process.env, DATABASE_URL: store.url }, [])
  try {
    await waitUntil(child, 'healthy', () => isHealthy(`http://127.0.0.1:${adminPort}/health`), 60_000)
  } catch (err) {
    await stopChild(child)
    throw err
  }
  return { port, child, stop: () => stopChild(child) }
}

/**
 * The Authorization header of a worker (`sub` = its worker id, scope jobs:work) or, without
 * one, of a producer (jobs:start); signed once per identity, as a worker holds its token.
 */
export function benchTokens(): (worker?: string) => Promise<Record<string, string>> {
  const signed = new Map<string, Promise<string>>()
  return async (worker) => {
    const sub = worker ?? 'producer'
    let token = signed.get(sub)
    if (!token) {
      token = new SignJWT({ tenant_id: 'default', sub, scope: worker ? 'jobs:work' : 'jobs:start' })
        .setProtectedHeader({ alg: 'HS256' }).setIssuer(issuer).setAudience(audience).setIssuedAt().setExpirationTime('2h')
        .sign(new TextEncoder().encode(secret))
      signed.set(sub, token)
    }
    return { authorization: `Bearer ${await token}` }
  }
}
