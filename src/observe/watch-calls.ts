/** What happens when a watched call settles: `failed` with the rejection, or not. */
export type Settle = (failed: boolean, err?: unknown) => void

/**
 * A copy of `store` whose methods are watched: `begin(call)` runs before each call and gives
 * what to run when its promise settles (undefined: nothing). `close` and non-functions pass
 * through. A method that returns no promise is not a statement: with `sync: 'skip'` it is not
 * watched at all, with `'settle'` it settles at once. The loop behind the metrics' `instrument`
 * (the traces' `storeSpans` builds its methods once per store instead, being made per command).
 *
 * @example
 * const timed = watchCalls(store, (call) => { const t = performance.now(); return () => console.log(call, performance.now() - t) }, 'skip')
 */
export function watchCalls<S extends object>(store: S, begin: (call: string) => Settle | undefined, sync: 'skip' | 'settle'): S {
  const wrapped: Record<string, unknown> = {}
  for (const [call, fn] of Object.entries(store)) {
    if (typeof fn !== 'function' || call === 'close') {
      wrapped[call] = fn
      continue
    }
    wrapped[call] = (...args: unknown[]) => {
      const settle = begin(call)
      const result: unknown = (fn as (...a: unknown[]) => unknown)(...args)
      if (!settle) return result
      if (!(result instanceof Promise)) {
        if (sync === 'settle') settle(false)
        return result
      }
      return result.then((value: unknown) => {
        settle(false)
        return value
      }, (err: unknown) => {
        settle(true, err)
        throw err
      })
    }
  }
  return wrapped as S
}
