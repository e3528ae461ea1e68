import { execFileSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { connect, type AddressInfo, type Socket } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createServer } from 'node:tls'

/** A throwaway CA and a server certificate it signed for 127.0.0.1 and localhost, made by openssl. */
export interface TestCertificates {
  ca: Buffer
  key: Buffer
  cert: Buffer
}

/** Makes a CA and a server certificate in a temporary directory (removed again), with openssl. */
export function makeCertificates(): TestCertificates {
  const dir = mkdtempSync(join(tmpdir(), 'fg-tls-'))
  const at = (name: string) => join(dir, name)
  const ssl = (...args: string[]) => execFileSync('openssl', args, { stdio: 'pipe' })
  try {
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes']
    ssl('req', '-x509', ...ec, '-keyout', at('ca.key'), '-out', at('ca.pem'), '-days', '2', '-subj', '/CN=fencegate test CA')
    ssl('req', ...ec, '-keyout', at('server.key'), '-out', at('server.csr'), '-subj', '/CN=127.0.0.1')
    writeFileSync(at('ext.cnf'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n')
    ssl('x509', '-req', '-in', at('server.csr'), '-CA', at('ca.pem'), '-CAkey', at('ca.key'), '-CAcreateserial', '-out', at('server.pem'), '-days', '2', '-extfile', at('ext.cnf'))
    return { ca: readFileSync(at('ca.pem')), key: readFileSync(at('server.key')), cert: readFileSync(at('server.pem')) }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}

/** A TLS terminator on loopback in front of a plain HTTP port, as a load balancer in TCP mode is. */
export interface TlsFront {
  url: string
  close(): Promise<void>
}

/** Terminates TLS with `certs` and passes the bytes to 127.0.0.1:`port` unchanged. */
export async function startTlsFront(certs: TestCertificates, port: number): Promise<TlsFront> {
  const sockets = new Set<Socket>()
  const track = (s: Socket) => {
    sockets.add(s)
    s.on('close', () => sockets.delete(s))
  }
  const server = createServer({ key: certs.key, cert: certs.cert }, (client) => {
    const backend = connect(port, '127.0.0.1')
    track(client)
    track(backend)
    client.pipe(backend)
    backend.pipe(client)
    // One side gone ends the other, as a terminator does: a reset stays a reset.
    client.on('error', () => backend.destroy())
    backend.on('error', () => client.destroy())
    client.on('close', () => backend.destroy())
    backend.on('close', () => client.destroy())
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `https://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () => new Promise((resolve) => {
      for (const s of sockets) s.destroy()
      server.close(() => resolve())
    }),
  }
}
