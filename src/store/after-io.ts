/**
 * A timeout that fires only after the I/O that arrived by then was read. Node runs its due
 * timers before it polls sockets and pipes, so a process the host did not schedule for `ms`
 * (a loaded or CPU-throttled container, as during a failover) would time out an answer that
 * was already waiting in its socket or pipe; `setImmediate` runs after the poll phase (workerd
 * has it too, under `nodejs_compat`). The pool's wait for a live connection (`slots.ts`) and
 * the workers' questions to each other (`src/runtime/node/`) time out with it.
 *
 * @example
 * const timer = timeoutAfterIo(() => settle(undefined), 2000)
 * // the answer came: timer.cancel(); settle(answer)
 */
export function timeoutAfterIo(fire: () => void, ms: number): { cancel(): void } {
  let cancelled = false
  let immediate: ReturnType<typeof setImmediate> | undefined
  const timer = setTimeout(() => {
    immediate = setImmediate(() => cancelled || fire())
  }, ms)
  return {
    cancel() {
      cancelled = true
      clearTimeout(timer)
      if (immediate !== undefined) clearImmediate(immediate)
    },
  }
}
