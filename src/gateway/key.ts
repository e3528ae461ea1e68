import { isStorableText } from '../config/templates.js'
import { FencegateError } from '../http/problems.js'
import { idempotencyHeader, maxKeyLength, parseIdempotencyKey } from './idempotency.js'
import { fillTemplate, type EntitySources, type Route } from './route.js'

/**
 * A command's idempotency key, read by its route's `idempotency_key` template from the
 * same sources (and the same one parse of the body) as its entity. A header part is read
 * with the key header's grammar (one sf-string or bare token: two headers joined by a
 * comma are refused); the whole key is text PostgreSQL stores as given, at most
 * `maxKeyLength` characters.
 */

/** The key, or undefined when the request does not name one (a source is absent or empty), with what it lacks. */
export type KeyReading = { key: string } | { missing: string }

/**
 * Reads the route's key from a request, or says which source it lacks; throws
 * `invalid_idempotency_key` for a key that is malformed or too long.
 *
 * @example readKey(route, sources) // { key: 'sq-7f3a' } for idempotency_key: "{body.idempotency_key}"
 */
export function readKey(route: Pick<Route, 'key' | 'keyHeader'>, sources: EntitySources): KeyReading {
  const filled = fillTemplate(route.key, sources, (value, name) => parseIdempotencyKey(value, headerLabel(name)))
  if ('missing' in filled) return filled
  const key = filled.value
  // A header key was checked by its grammar; a key from the body, path or query only here.
  if (route.keyHeader !== undefined) return { key }
  const invalid = (why: string) => new FencegateError('invalid_idempotency_key', `the idempotency key ${why}`)
  if (key.length > maxKeyLength) throw invalid(`is longer than ${maxKeyLength} characters`)
  if (!isStorableText(key)) throw invalid('contains control characters or invalid Unicode')
  return { key }
}

/** What a refusal calls the key: the header's name, or the template's first missing source. */
export function keyLabel(route: Pick<Route, 'keyHeader'>, missing: string): string {
  return route.keyHeader === undefined ? `an idempotency key (${missing} is missing from the request)` : headerLabel(route.keyHeader)
}

function headerLabel(name: string): string {
  return name === idempotencyHeader ? 'Idempotency-Key' : `header ${name}`
}
