import { connect, Socket } from 'node:net'
import postgres from 'postgres'
import { storeUnlisten, toStoreError, StoreError, type Db } from './db.js'
import { connectionLost, inFlight, pooled, refusedWrite } from './postgres-pool.js'
import { createPrimaryFinder, readStoreHosts, type PrimaryFinder } from './primary.js'
import { createSlotGate, heldCode, type SlotGate } from './slots.js'

export interface PostgresOptions {
  /** Pool size; the default suits one gateway process. */
  max?: number
  /**
   * How long a statement may wait for a connection to open, in milliseconds (default 1000,
   * `store.connect_timeout`). With the store unreachable, this bounds every refusal.
   */
  connectTimeoutMs?: number
  /**
   * `transaction` behind a pooler in transaction mode (PgBouncer before 1.21): no named
   * prepared statements (the next statement may land on another server connection) and
   * no pipelining (requests hung there when statements queued on one connection, test/pgbouncer.test.ts).
   */
  pooler?: 'none' | 'transaction'
  /**
   * Where LISTEN connects (`store.listen_url`): a direct or session-mode connection beside a
   * URL through a transaction pooler. Without it, LISTEN uses the pool's URL, except behind a
   * transaction pooler, where there is none: PgBouncer hands the LISTEN's server connection to
   * other clients, and notifications sent to it are dropped, so waiting claims and the rules
   * fall back to polling (`listen` is then undefined, and says so).
   */
  listenUrl?: string
}

/**
 * A Db on PostgreSQL through postgres.js. Statements are prepared and every
 * commit is durable (the server's synchronous_commit decides, default on).
 *
 * Connection health is owned here:
 * - No per-connection type lookup: its promise had no listener, and a connection dropped
 *   right after opening crashed the process.
 * - A short jittered reconnect delay per connection, instead of postgres.js's, which grows
 *   with a retry count the whole pool shares (up to 20 s).
 * - A client that lost a connection is retired whole: new statements go to a fresh client
 *   while the old one finishes what it runs. postgres.js 3.4.9 carries a dropped
 *   connection's state into its reconnect: the dead backend's `57P01`, replayed onto the next
 *   statement (porsager/postgres#1215, #1223), and a write it never flushed, which stalls the
 *   next startup until `connect_timeout` (porsager/postgres#1209). Until a retired client's
 *   statements finish (its `end` waits at most 5 s), its connections count on top of `max`.
 * - One retry, on the current client, of a statement that failed before it could have
 *   reached the server (`failedBeforeSending`).
 * - An answer whose first row is a hole fails as a store failure (src/store/postgres-pool.ts:
 *   postgres.js 3.4.9 leaves one after a statement that failed midway through its rows).
 * - Its own sockets, so that a pool the server refuses new connections (`53300`, or none up
 *   within the connect timeout) opens none while it serves on the ones it has (src/store/slots.ts).
 *
 * @example
 * const db = connectPostgres('postgres://postgres@127.0.0.1:5432/fencegate', { connectTimeoutMs: 1000 })
 */
export function connectPostgres(url: string, options: PostgresOptions = {}): Db {
  const max = options.max ?? 20
  const connectTimeoutMs = options.connectTimeoutMs ?? 1000
  const idleTimeoutS = 60
  const slots = createSlotGate(connectTimeoutMs, idleTimeoutS * 1000)
  // Several hosts: fencegate picks the one each connection goes to (src/store/primary.ts).
  const hosts = readStoreHosts(url)
  const finder = hosts.hosts.length > 1 ? createPrimaryFinder(hosts, connectTimeoutMs) : undefined
  const gated = Boolean(finder) || singleHost(url)
  const open = (withSockets: boolean) => postgres(hosts.url, {
    max,
    // postgres.js takes seconds; fractions work (it multiplies by 1000 for its timer).
    connect_timeout: connectTimeoutMs / 1000,
    idle_timeout: idleTimeoutS,
    // fencegate binds no array parameters and reads no array columns.
    fetch_types: false,
    prepare: options.pooler !== 'transaction',
    // Behind a transaction pooler no statement may queue behind another on one client
    // connection (requests through PgBouncer 1.18 hung when they did): at most one waits here
    // (postgres.js needs 1 for its transactions), and `inFlight` below keeps it at none.
    ...(options.pooler === 'transaction' ? { max_pipeline: 1 } : {}),
    // A held pool's connections fail at once and hand their next queued statement on at once.
    backoff: () => (withSockets && slots.holding() ? 0 : reconnectDelaySeconds()),
    ...(withSockets ? { socket: gatedSocket(slots, finder) } : finder ? { socket: gatedSocket(undefined, finder) } : {}),
    onnotice: () => {},
    connection: { application_name: 'fencegate' },
  })
  let client = open(gated)
  // LISTEN gets a client of its own, never retired nor held: postgres.js re-listens after a drop.
  let listener: postgres.Sql | undefined
  const listenClient = () => (options.listenUrl ? listenOnly(options.listenUrl, connectTimeoutMs) : open(false))
  const listens = options.listenUrl !== undefined || options.pooler !== 'transaction'
  const draining = new Set<Promise<void>>()
  // A failure that lost its connection retires the client it ran on, once.
  // So does a write refused by a read-only node (a standby, an old primary): the hosts are asked again.
  const failedOn = (failed: postgres.Sql, err: StoreError) => {
    if (failed !== client || !(connectionLost(err) || refusedWrite(err))) return
    finder?.forget()
    client = open(gated)
    const done = failed.end({ timeout: 5 }).catch(() => {}).then(() => void draining.delete(done))
    draining.add(done)
  }
  const db = pooled(() => client, failedOn, slots, options.pooler === 'transaction' ? inFlight(max) : undefined)
  return {
    ...db,
    // LISTEN follows the primary too: after a failover a standby's notifications never come.
    ...(listens ? { listen: (channel: string, onNotify: (payload: string) => void, onReconnect?: () => void) => listenOn((listener ??= listenClient()), channel, onNotify, onReconnect) } : {}),
    async close() {
      await Promise.all([client.end({ timeout: 5 }), listener?.end({ timeout: 5 }), ...draining])
    },
  }
}

/** The client of `store.listen_url`: LISTEN only, so one connection, reconnecting as the pool's do. */
function listenOnly(url: string, connectTimeoutMs: number): postgres.Sql {
  return postgres(url, {
    max: 1, connect_timeout: connectTimeoutMs / 1000, fetch_types: false, onnotice: () => {},
    backoff: reconnectDelaySeconds, connection: { application_name: 'fencegate' },
  })
}

/**
 * Connects to `url` once and runs `SELECT 1`: how `store.listen_url` is checked at start, so a
 * wrong one fails the start rather than leave rule changes and wake-ups to the fallback polls.
 *
 * @example
 * await checkConnects('postgres://postgres@db:5432/fencegate', 1000)
 */
export async function checkConnects(url: string, connectTimeoutMs: number): Promise<void> {
  const probe = listenOnly(url, connectTimeoutMs)
  try {
    await probe`SELECT 1`
  } catch (err) {
    throw toStoreError(err)
  } finally {
    await probe.end({ timeout: 1 }).catch(() => {})
  }
}

/** Whether the URL names one host (or a Unix socket), as postgres.js reads it. */
function singleHost(url: string): boolean {
  const parsed = postgres(url, { max: 1, fetch_types: false, onnotice: () => {} })
  void parsed.end()
  return Boolean(parsed.options.path) || parsed.options.host.length === 1
}

/** What postgres.js passes its `socket` option: the parsed host list, ports and Unix socket path. */
interface SocketTarget {
  host: string[]
  port: number[]
  path: string | false
}

/**
 * postgres.js's `socket` option: a connection to the one host (or Unix socket), or to the host
 * the finder picks among several, as postgres.js opens one itself. While the pool is held
 * (`slots`), or when no host qualifies, a socket that fails at once without touching the
 * network (`FENCEGATE_POOL_HELD`, `FENCEGATE_NO_PRIMARY`): the statement was never sent.
 */
function gatedSocket(slots: SlotGate | undefined, finder: PrimaryFinder | undefined): (target: SocketTarget) => Promise<Socket> {
  return async (target) => {
    if (slots && !slots.mayOpen()) return failedSocket(heldCode, 'the pool opens no connection while the server refuses them')
    if (target.path) return untilWritten(connect(target.path))
    const to = finder ? await finder.pick() : { host: target.host[0]!, port: target.port[0]! }
    if (!to) return failedSocket(noPrimaryCode, 'no host of store.url is a writable primary')
    const socket = untilWritten(connect(to.port, to.host))
    // As postgres.js's own sockets: under SSL it names the host for SNI from `socket.host`.
    return Object.assign(socket, { host: to.host, port: to.port })
  }
}

/** The driver code of a connection not opened because no host of the URL qualifies now. */
export const noPrimaryCode = 'FENCEGATE_NO_PRIMARY'

function failedSocket(code: string, message: string): Socket {
  const failed = untilWritten(new Socket())
  failed.destroy(Object.assign(new Error(message), { code }))
  return failed
}

/**
 * The socket, with its 'error' and 'close' kept back until postgres.js has first written to
 * it. Given a socket of its option, postgres.js writes the startup message at once, not on
 * 'connect', and a failure heard before that write went out (a refused connection on
 * loopback, a held socket) left the message queued in the connection, never flushed, ahead
 * of the next startup on it, which then stalled until the connect timeout
 * (porsager/postgres#1209). A socket that failed first skips the write and reports why.
 */
function untilWritten(socket: Socket): Socket {
  let kept: [string | symbol, unknown[]][] | undefined = []
  const emit = answeredOrFailed(socket)
  const write = socket.write.bind(socket)
  socket.emit = ((event: string | symbol, ...args: unknown[]) => {
    if (kept === undefined || (event !== 'error' && event !== 'close')) return emit(event, ...args)
    kept.push([event, args])
    return true
  }) as Socket['emit']
  socket.write = ((...args: Parameters<Socket['write']>) => {
    const failed = kept!
    kept = undefined
    socket.write = write
    if (failed.length === 0) return write(...args)
    process.nextTick(() => {
      for (const [event, eventArgs] of failed) emit(event, ...eventArgs)
    })
    return false
  }) as Socket['write']
  return socket
}

/**
 * The socket's emit, with a close before the server said anything turned into a failure.
 * postgres.js reconnects a connection that closes during its startup, keeping the statement
 * that waits for it, with no bound: behind something that accepts connections and closes them
 * at once (a proxy or load balancer with no server behind it, a server that dies on each
 * fork) a statement waited forever, and the reconnects, each a fresh TCP connection, spun
 * the process. A server that refuses a startup says why first (an ErrorResponse), so a
 * close with nothing heard is reported as `ECONNRESET`: the statement was never sent, and
 * fails as when the connection is refused.
 */
function answeredOrFailed(socket: Socket): Socket['emit'] {
  const emit = socket.emit.bind(socket)
  let heard = false
  let failed = false
  return ((event: string | symbol, ...args: unknown[]) => {
    if (event === 'data') heard = true
    else if (event === 'error') failed = true
    else if (event === 'close' && !heard && !failed) {
      failed = true
      emit('error', Object.assign(new Error('the server closed the connection before answering its startup'), { code: 'ECONNRESET' }))
    }
    return emit(event, ...args)
  }) as Socket['emit']
}

/**
 * The wait before a closed connection reconnects: 50–250 ms at random, whatever the pool's
 * shared retry count says. The jitter keeps a pool's connections from reconnecting in step
 * after a restart; the cap keeps the first request after the store returns fast.
 */
export function reconnectDelaySeconds(): number {
  return 0.05 + Math.random() * 0.2
}

/**
 * LISTEN through postgres.js: one dedicated connection for every channel of this client,
 * which postgres.js re-opens (with backoff) and re-listens on after it drops. Its
 * `onlisten` runs on the first LISTEN and on every re-listen; only the re-listens are reported.
 */
async function listenOn(sql: postgres.Sql, channel: string, onNotify: (payload: string) => void, onReconnect?: () => void): Promise<() => Promise<void>> {
  let first = true
  try {
    const { unlisten } = await sql.listen(channel, onNotify, () => {
      if (!first) onReconnect?.()
      first = false
    })
    return storeUnlisten(unlisten)
  } catch (err) {
    throw toStoreError(err)
  }
}

