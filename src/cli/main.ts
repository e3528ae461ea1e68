#!/usr/bin/env node
import { parseArgs, type ParseArgsConfig } from 'node:util'
import { ConfigError } from '../config/schema.js'
import { MigrationError } from '../store/migrate.js'
import { runAudit } from './audit.js'
import { runMigrate } from './migrate.js'
import { runServe } from './serve.js'
import { UsageError } from './usage.js'


interface Command {
  summary: string
  options: NonNullable<ParseArgsConfig['options']>
  help: Record<string, string>
  run(values: Record<string, string | boolean | undefined>): Promise<number | void>
}

const store = {
  'database-url': { type: 'string' },
  config: { type: 'string', short: 'c' },
  'data-dir': { type: 'string' },
} as const
const storeHelp = {
  'database-url': 'PostgreSQL URL (else store.url from --config, else DATABASE_URL, else the embedded store)',
  config: 'configuration file (YAML)',
  'data-dir': 'embedded store directory (default: store.data_dir, else .fencegate)',
}

const commands: Record<string, Command> = {
  serve: {
    summary: 'run the gateway (data plane and admin plane)',
    options: { ...store, port: { type: 'string' }, 'admin-port': { type: 'string' } },
    help: {
      ...storeHelp,
      config: 'configuration file (YAML, default fencegate.yaml)',
      port: 'data-plane port (overrides server.port)',
      'admin-port': 'admin-plane port (overrides server.admin_port)',
    },
    run: (v) => runServe(v),
  },
  migrate: {
    summary: 'apply pending database migrations and exit',
    options: store,
    help: storeHelp,
    run: (v) => runMigrate(v),
  },
  audit: {
    summary: 'list rejected commands, newest first',
    options: {
      ...store,
      'admin-url': { type: 'string' },
      token: { type: 'string' },
      tenant: { type: 'string' },
      entity: { type: 'string' },
      code: { type: 'string' },
      route: { type: 'string' },
      since: { type: 'string' },
      until: { type: 'string' },
      limit: { type: 'string' },
      cursor: { type: 'string' },
      json: { type: 'boolean' },
    },
    help: {
      ...storeHelp,
      'admin-url': "read from a running gateway's admin plane instead of the database (needed while the embedded store is in use)",
      token: 'bearer token for an admin plane with auth.mode: jwt (default: FENCEGATE_TOKEN)',
      tenant: 'only this tenant',
      entity: 'only this entity, e.g. invoice:42',
      code: 'only this code, e.g. stale_fence',
      route: 'only this route name',
      since: 'from this time (ISO-8601 with zone) or this long ago (15m, 1h, 7d)',
      until: 'before this time or this long ago',
      limit: 'rows per page, 1-1000 (default 100)',
      cursor: 'next_cursor of an earlier page',
      json: 'print {items, next_cursor} as JSON',
    },
    run: (v) => runAudit(v),
  },
}

function usage(): string {
  const lines = ['usage: fencegate <command> [options]', '', 'commands:']
  for (const [name, c] of Object.entries(commands)) lines.push(`  ${name.padEnd(9)} ${c.summary}`)
  lines.push('', "run 'fencegate <command> --help' for a command's options")
  return lines.join('\n')
}

function commandUsage(name: string, c: Command): string {
  const lines = [`usage: fencegate ${name} [options]`, '', c.summary, '', 'options:']
  for (const [flag, o] of Object.entries(c.options)) {
    const arg = o.type === 'string' ? ' <value>' : ''
    lines.push(`  --${flag}${arg}`.padEnd(28) + (c.help[flag] ?? ''))
  }
  lines.push('  --help'.padEnd(28) + 'show this help')
  return lines.join('\n')
}

async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    console.log(usage())
    return name ? 0 : 2
  }
  const command = commands[name]
  if (!command) {
    console.error(`fencegate: unknown command ${JSON.stringify(name)}\n\n${usage()}`)
    return 2
  }
  if (rest.includes('--help') || rest.includes('-h')) {
    console.log(commandUsage(name, command))
    return 0
  }
  try {
    const { values } = parseArgs({ args: rest, options: command.options, strict: true, allowPositionals: false })
    return (await command.run(values as Record<string, string | boolean | undefined>)) ?? 0
  } catch (err) {
    if (err instanceof ConfigError || err instanceof MigrationError) {
      console.error(`fencegate ${name}: ${err.message}`)
      return 2
    }
    if (err instanceof UsageError || (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) {
      console.error(`fencegate ${name}: ${(err as Error).message}\n\n${commandUsage(name, command)}`)
      return 2
    }
    console.error(`fencegate ${name}: ${(err as Error).message ?? err}`)
    return 1
  }
}

main(process.argv.slice(2)).then((code) => {
  if (code !== 0) process.exitCode = code
})
