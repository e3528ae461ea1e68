import { readFileSync } from 'node:fs'
import { parse } from 'yaml'
import { prepareExpansion, ExpansionError } from './expand.js'
import { ConfigError, parseConfig, type Config } from './schema.js'

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

/** Expands and validates configuration text; `source` names it in errors. */
export function loadConfigText(text: string, env: Record<string, string | undefined>, source = 'config'): Config {
  const expansion = prepareExpansion(text, env)
  let raw: unknown
  try {
    raw = parse(expansion.text, { prettyErrors: true })
  } catch (err) {
    throw new ConfigError([`${source}: not valid YAML: ${(err as Error).message.split('\n')[0]}`])
  }
  try {
    raw = expansion.restore(raw)
  } catch (err) {
    if (err instanceof ExpansionError) throw new ConfigError([`${source}: ${err.message}`])
    throw err
  }
  try {
    return parseConfig(raw)
  } catch (err) {
    if (err instanceof ConfigError) throw new ConfigError(err.problems.map((p) => `${source}: ${p}`))
    throw err
  }
}
