#!/usr/bin/env -S node --max-old-space-size=1024 --max-semi-space-size=8
// The heap limits above are part of the product's defaults: with no old-space maximum (or one
// of 2 GB or more) V8 lets the old generation grow to about four times the live heap under
// load, and the gateway peaked near 220 MiB; with it, near 140 MiB. Semi-spaces of 8 instead
// of 16 MiB took another 15 MiB off that peak at the same CPU per request (docs/benchmarks.md#memory).
import { parseArgs, type ParseArgsConfig } from 'node:util'
import { ConfigError } from '../config/schema.js'
import { StoreError } from '../store/db.js'
import { storeFailureHint } from '../store/failure-hints.js'
import { MigrationError } from '../store/migrate.js'
import { runAudit } from './audit.js'
import { runMigrate } from './migrate.js'
import { runBump, runRulesApply, runRulesHistory, runRulesList } from './rules.js'
import { runServe } from './serve.js'
import { UsageError } from './usage.js'


interface Command {
  summary: string
  options: NonNullable<ParseArgsConfig['options']>
  help: Record<string, string>
  /** Positional arguments, for the usage line (`apply|list|history NAME`); commands without them refuse any. */
  positionals?: string
  run(values: Record<string, string | boolean | undefined>, positionals: string[]): Promise<number | void>
}

const admin = {
  'admin-url': { type: 'string' },
  token: { type: 'string' },
} as const
const adminHelp = {
  'admin-url': "the gateway's admin plane (default: FENCEGATE_ADMIN_URL, else http://127.0.0.1:8081)",
  token: 'bearer token with the fencegate:admin scope (default: FENCEGATE_TOKEN)',
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
    options: { ...store, port: { type: 'string' }, 'admin-port': { type: 'string' }, workers: { type: 'string' } },
    help: {
      ...storeHelp,
      config: 'configuration file (YAML, default fencegate.yaml)',
      port: 'data-plane port (overrides server.port)',
      'admin-port': 'admin-plane port (overrides server.admin_port)',
      workers: 'worker processes on the same ports, a number or auto (overrides server.workers)',
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
      caller: { type: 'string' },
      'trace-id': { type: 'string' },
      since: { type: 'string' },
      until: { type: 'string' },
      limit: { type: 'string' },
      cursor: { type: 'string' },
      json: { type: 'boolean' },
      format: { type: 'string' },
      follow: { type: 'boolean' },
      every: { type: 'string' },
    },
    help: {
      ...storeHelp,
      'admin-url': "read from a running gateway's admin plane instead of the database (needed while the embedded store is in use)",
      token: 'bearer token for an admin plane with auth.mode: jwt (default: FENCEGATE_TOKEN)',
      tenant: 'only this tenant',
      entity: 'only this entity, e.g. invoice:42',
      code: 'only this code, e.g. stale_fence',
      route: 'only this route name',
      caller: "only this caller (the token's sub)",
      'trace-id': 'only rows of this trace: the 32-hex trace id of the request that caused them',
      since: 'from this time (ISO-8601 with zone) or this long ago (15m, 1h, 7d)',
      until: 'before this time or this long ago',
      limit: 'rows per page, 1-1000 (default 100)',
      cursor: 'next_cursor of an earlier page',
      json: 'print {items, next_cursor} as JSON (same as --format json)',
      format: 'table (default), json (one page), ndjson or csv (every matching row, up to --limit when given)',
      follow: 'keep printing new rejections as they are recorded (polls the admin plane, --admin-url or FENCEGATE_ADMIN_URL or http://127.0.0.1:8081; Ctrl-C stops)',
      every: 'with --follow: how often to poll (default 1s)',
    },
    run: (v) => runAudit(v),
  },
  rules: {
    summary: 'list, show the history of, or declaratively apply routes and entity rules',
    positionals: 'list | history <name> | apply -f <file>',
    options: { ...admin, file: { type: 'string', short: 'f' }, 'dry-run': { type: 'boolean' }, prune: { type: 'boolean' }, limit: { type: 'string' }, json: { type: 'boolean' } },
    help: {
      ...adminHelp,
      file: 'apply: a YAML file with routes: and entity_rules:, as in the configuration file',
      'dry-run': 'apply: print the diff and change nothing',
      prune: 'apply: also delete rules that are not in the file',
      limit: 'history: versions to show (default 100)',
      json: 'list, history: print JSON',
    },
    run: (v, p) => {
      const [sub, ...args] = p
      if (sub === 'list' && args.length === 0) return runRulesList(v)
      if (sub === 'history' && args.length === 1) return runRulesHistory(v, args[0]!)
      if (sub === 'apply' && args.length === 0) return runRulesApply(v)
      throw new UsageError('expected list, history <name> or apply -f <file>')
    },
  },
  entities: {
    summary: "raise an entity's fence floor (incident response)",
    positionals: 'bump <entity> --to <fence>',
    options: { ...admin, to: { type: 'string' }, tenant: { type: 'string' } },
    help: { ...adminHelp, to: 'the lowest fence that stays valid: every holder of a lower one is rejected from now on', tenant: 'the tenant whose entity it is (default: the token\'s, or default)' },
    run: (v, p) => {
      if (p[0] === 'bump' && p.length === 2) return runBump(v, p[1]!)
      throw new UsageError('expected bump <entity> --to <fence>')
    },
  },
}

function usage(): string {
  const lines = ['usage: fencegate <command> [options]', '', 'commands:']
  for (const [name, c] of Object.entries(commands)) lines.push(`  ${name.padEnd(9)} ${c.summary}`)
  lines.push('', "run 'fencegate <command> --help' for a command's options")
  return lines.join('\n')
}

function commandUsage(name: string, c: Command): string {
  const lines = [`usage: fencegate ${name}${c.positionals ? ` ${c.positionals}` : ''} [options]`, '', c.summary, '', 'options:']
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
    const { values, positionals } = parseArgs({ args: rest, options: command.options, strict: true, allowPositionals: command.positionals !== undefined })
    return (await command.run(values as Record<string, string | boolean | undefined>, positionals)) ?? 0
  } catch (err) {
    if (err instanceof ConfigError || err instanceof MigrationError) {
      console.error(`fencegate ${name}: ${err.message}`)
      return 2
    }
    if (err instanceof UsageError || (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) {
      console.error(`fencegate ${name}: ${(err as Error).message}\n\n${commandUsage(name, command)}`)
      return 2
    }
    const hint = err instanceof StoreError ? storeFailureHint(err) : undefined
    console.error(`fencegate ${name}: ${(err as Error).message ?? err}${hint ? `: ${hint}` : ''}`)
    return 1
  }
}

main(process.argv.slice(2)).then((code) => {
  if (code !== 0) process.exitCode = code
  // A worker of `serve --workers` that failed keeps its channel to the supervisor open, which
  // kept it alive: the supervisor never saw it exit and waited forever. It exits now, with its code.
  if (code !== 0 && process.connected) process.exit(code)
})
