import { readFileSync } from 'node:fs'
import { ConfigError, type Config } from './schema.js'
import { loadConfigText } from './text.js'

export { loadConfigText } from './text.js'

/**
 * Reads, expands (`${VAR}`, `${file:/path}`) and validates a YAML configuration file. Any problem throws a
 * ConfigError naming the file and each bad field: fencegate never starts on a
 * configuration it had to guess about.
 *
 * @example
 * const config = loadConfigFile('fencegate.yaml', process.env)
 */
export function loadConfigFile(path: string, env: Record<string, string | undefined>): Config {
  return openConfigFile(path, env).load()
}

/** A configuration file read once, whose `${file:…}` secrets are read each time it is loaded. */
export interface ConfigSource {
  /** Expands and validates the text read at start, reading its secret files now; throws a ConfigError naming each bad field. */
  load(): Config
}

/**
 * Reads the configuration file's text once; `load` reads its `${file:…}` secrets anew each
 * time (at start, and on SIGHUP: a rotated Kubernetes Secret or systemd credential). The YAML
 * itself is not read again: its variables and everything else stay what they were at start.
 *
 * @example
 * const source = openConfigFile('fencegate.yaml', process.env)
 * const config = source.load()
 * process.on('SIGHUP', () => useSecrets(source.load()))
 */
export function openConfigFile(path: string, env: Record<string, string | undefined>): ConfigSource {
  let text: string
  try {
    text = readFileSync(path, 'utf8')
  } catch (err) {
    throw new ConfigError([`${path}: cannot read (${(err as NodeJS.ErrnoException).code ?? 'error'})`])
  }
  // The variables as they were at start: SIGHUP re-reads files, not the environment.
  const atStart = { ...env }
  return { load: () => loadConfigText(text, atStart, path, (file) => readFileSync(file, 'utf8')) }
}
