import { readFileSync } from 'node:fs'
import { ConfigError, type Config } from './schema.js'
import { loadConfigText } from './text.js'

export { loadConfigText } from './text.js'

/**
 * Reads, expands and validates a YAML configuration file. Any problem throws a
 * ConfigError naming the file and each bad field: fencegate never starts on a
 * configuration it had to guess about.
 *
 * @example
 * const config = loadConfigFile('fencegate.yaml', process.env)
 */
export function loadConfigFile(path: string, env: Record<string, string | undefined>): Config {
  let text: string
  try {
    text = readFileSync(path, 'utf8')
  } catch (err) {
    throw new ConfigError([`${path}: cannot read (${(err as NodeJS.ErrnoException).code ?? 'error'})`])
  }
  return loadConfigText(text, env, path)
}
