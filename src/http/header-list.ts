import type { HeaderFields } from './exchange.js'

/**
 * Header fields as a plain list, for the headers the data plane builds per command (the
 * upstream request's, the upstream answer's, the client's). Web `Headers` validates every
 * name and value it is given, and sorts its whole list each time it is iterated (undici's
 * `toSortedArray`); these fields come from Node's HTTP parser, undici's and the checked
 * config, so neither is needed, and three `Headers` per forwarded command were the largest
 * allocation left on its path. Names are lower-cased; `get` joins repeated fields with ", "
 * and `forEach` yields each name once in first-seen order, as `HeaderView` promises.
 *
 * @example
 * const headers = new HeaderList([['content-type', 'application/json']])
 * headers.set('x-request-id', requestId)
 * headers.get('Content-Type') // 'application/json'
 */
export class HeaderList implements HeaderFields {
  // Parallel arrays: a command's dozen fields are scanned faster than they are hashed.
  private readonly names: string[] = []
  private readonly values: string[] = []

  constructor(init?: Iterable<readonly [string, string]>) {
    if (init) for (const [name, value] of init) this.append(name, value)
  }

  get(name: string): string | null {
    const key = name.toLowerCase()
    let found: string | null = null
    for (let i = 0; i < this.names.length; i++) {
      if (this.names[i] === key) found = found === null ? this.values[i]! : `${found}, ${this.values[i]!}`
    }
    return found
  }

  has(name: string): boolean {
    return this.names.includes(name.toLowerCase())
  }

  append(name: string, value: string): void {
    this.names.push(name.toLowerCase())
    this.values.push(value)
  }

  set(name: string, value: string): void {
    const key = name.toLowerCase()
    const at = this.names.indexOf(key)
    if (at === -1) return this.append(key, value)
    this.values[at] = value
    this.remove(key, at + 1)
  }

  delete(name: string): void {
    this.remove(name.toLowerCase(), 0)
  }

  getSetCookie(): string[] {
    return this.values.filter((_, i) => this.names[i] === 'set-cookie')
  }

  forEach(each: (value: string, name: string) => void): void {
    for (let i = 0; i < this.names.length; i++) {
      const name = this.names[i]!
      // A repeated name was (or will be) yielded whole at its first position.
      if (this.names.indexOf(name) === i) each(this.names.lastIndexOf(name) === i ? this.values[i]! : this.get(name)!, name)
    }
  }

  private remove(key: string, from: number): void {
    for (let i = this.names.length - 1; i >= from; i--) {
      if (this.names[i] === key) {
        this.names.splice(i, 1)
        this.values.splice(i, 1)
      }
    }
  }
}
