import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

/** A throwaway PKI made by `openssl`: file paths for the gateway's config, and the bytes for servers. */
export interface TestPki {
  dir: string
  /** The CA that signed `server` and `client`. */
  caFile: string
  /** Another CA, which signed `rogue`: a server certificate the gateway must not trust. */
  otherCaFile: string
  server: { certFile: string; keyFile: string }
  rogue: { certFile: string; keyFile: string }
  client: { certFile: string; keyFile: string }
  read(file: string): Buffer
  remove(): void
}

const openssl = (dir: string, args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' })

function makeCa(dir: string, name: string): void {
  openssl(dir, ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.crt`, '-subj', `/CN=${name}`, '-days', '2'])
}

function issue(dir: string, ca: string, name: string, cn: string, ext: string): void {
  openssl(dir, ['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${cn}`])
  writeFileSync(join(dir, `${name}.ext`), ext)
  openssl(dir, ['x509', '-req', '-in', `${name}.csr`, '-CA', `${ca}.crt`, '-CAkey', `${ca}.key`, '-CAcreateserial', '-out', `${name}.crt`, '-days', '2', '-extfile', `${name}.ext`])
}

/**
 * Makes a CA, a server certificate for 127.0.0.1 and localhost, a client certificate, and a
 * second CA with a server certificate of its own, in a new temporary directory.
 *
 * @example
 * const pki = makeTestPki()
 * const upstream = await startUpstream(undefined, { tls: { cert: pki.read(pki.server.certFile), key: pki.read(pki.server.keyFile) } })
 */
export function makeTestPki(): TestPki {
  const dir = mkdtempSync(join(tmpdir(), 'fencegate-pki-'))
  makeCa(dir, 'ca')
  makeCa(dir, 'other-ca')
  const serverExt = 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n'
  issue(dir, 'ca', 'server', 'localhost', serverExt)
  issue(dir, 'other-ca', 'rogue', 'localhost', serverExt)
  issue(dir, 'ca', 'client', 'fencegate', 'extendedKeyUsage=clientAuth\n')
  const pair = (name: string) => ({ certFile: join(dir, `${name}.crt`), keyFile: join(dir, `${name}.key`) })
  return {
    dir,
    caFile: join(dir, 'ca.crt'),
    otherCaFile: join(dir, 'other-ca.crt'),
    server: pair('server'),
    rogue: pair('rogue'),
    client: pair('client'),
    read: (file) => readFileSync(file),
    remove: () => rmSync(dir, { recursive: true, force: true }),
  }
}
