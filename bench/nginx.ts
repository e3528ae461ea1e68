// nginx, when it is on PATH: the upstream (`return 200`) and the `proxy_pass` reference.
// Each runs as one process (`master_process off`, so the pid whose CPU is read is the
// process doing the work), in the foreground, with its config and temp files in `dir`.
import { spawnSync } from 'node:child_process'
import { mkdirSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { startProcess, type Child } from './procs.js'

/** The nginx binary on PATH, or undefined. */
export function findNginx(): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(':').concat(['/usr/sbin', '/usr/local/sbin'])) {
    const candidate = join(dir || '.', 'nginx')
    const r = spawnSync(candidate, ['-v'], { encoding: 'utf8' })
    if (r.status === 0) return candidate
  }
  return undefined
}

export function nginxVersion(bin: string): string {
  const r = spawnSync(bin, ['-v'], { encoding: 'utf8' })
  return (r.stderr || r.stdout).trim().replace(/^nginx version: /, '')
}

/** The parts of a config both uses share: one process, no logs, keep-alive that outlasts every case. */
function config(dir: string, name: string, http: string): string {
  const tmp = (what: string) => `${what}_temp_path ${join(dir, `${name}-${what}`)};`
  return `daemon off;
master_process off;
worker_processes 1;
pid ${join(dir, `${name}.pid`)};
error_log stderr warn;
events { worker_connections 4096; }
http {
  access_log off;
  ${['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi'].map(tmp).join('\n  ')}
  keepalive_requests 10000000;
  keepalive_timeout 300s;
${http}
}
`
}

function start(bin: string, dir: string, name: string, http: string): Child {
  mkdirSync(dir, { recursive: true })
  const file = join(dir, `${name}.conf`)
  writeFileSync(file, config(dir, name, http))
  return startProcess(name, bin, ['-p', dir, '-e', 'stderr', '-c', file], process.env)
}

/** nginx answering every request `200 {"captured":true}`. */
export function startNginxUpstream(bin: string, dir: string, port: number): Child {
  return start(bin, dir, 'nginx-upstream', `  server {
    listen 127.0.0.1:${port};
    location / { default_type application/json; return 200 '{"captured":true}'; }
  }`)
}

/** nginx `proxy_pass` to the upstream over pooled keep-alive connections (HTTP/1.1, as undici does). */
export function startNginxProxy(bin: string, dir: string, port: number, upstreamPort: number): Child {
  return start(bin, dir, 'nginx-proxy', `  upstream backend {
    server 127.0.0.1:${upstreamPort};
    keepalive 128;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
  }
  server {
    listen 127.0.0.1:${port};
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }`)
}
