import { createServer, connect, type AddressInfo, type Socket } from 'node:net'

export interface Relay {
  /** Where clients connect instead of the target, e.g. `http://127.0.0.1:41234`. */
  url: string
  /** Stops forwarding in both directions; connections stay open and new ones are accepted, and every byte is held. */
  cut(): void
  /** Delivers everything held, in order, and forwards again, also what a client sent before it gave up and closed. */
  restore(): void
  /** Bytes held while cut. */
  held(): number
  close(): Promise<void>
}

interface Pipe {
  client: Socket
  target: Socket
  toTarget: Buffer[]
  toClient: Buffer[]
  clientGone: boolean
}

/**
 * A TCP relay to `127.0.0.1:targetPort`: a network between a worker and its
 * gateway that a test can partition. While cut, it neither forwards nor closes
 * anything: a request sent into it is late, not lost, as on a real network.
 *
 * @example
 * const relay = await startRelay(gateway.port)
 * relay.cut(); ...; relay.restore()
 */
export async function startRelay(targetPort: number): Promise<Relay> {
  const pipes = new Set<Pipe>()
  let cut = false
  const attach = (pipe: Pipe, target: Socket) => {
    pipe.target = target
    target.on('data', (chunk: Buffer) => {
      if (cut) pipe.toClient.push(chunk)
      else if (!pipe.clientGone) pipe.client.write(chunk)
    })
    target.on('close', () => {
      // While cut, the worker must not learn anything, not even that the gateway closed an idle connection.
      if (cut || pipe.target !== target) return
      pipe.client.destroy()
      pipes.delete(pipe)
    })
    target.on('error', () => undefined)
  }
  const server = createServer((client) => {
    const pipe: Pipe = { client, target: undefined as unknown as Socket, toTarget: [], toClient: [], clientGone: false }
    pipes.add(pipe)
    attach(pipe, connect(targetPort, '127.0.0.1'))
    client.on('data', (chunk: Buffer) => (cut ? pipe.toTarget.push(chunk) : pipe.target.write(chunk)))
    // A client that gives up (its fetch was aborted) does not take back what it sent: the target still gets it.
    client.on('close', () => {
      pipe.clientGone = true
      if (!cut && pipe.toTarget.length === 0) pipe.target.end()
    })
    client.on('error', () => undefined)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    cut() {
      cut = true
    },
    restore() {
      cut = false
      for (const pipe of [...pipes]) {
        const held = pipe.toTarget.splice(0)
        // The gateway may have closed the idle connection meanwhile: late bytes arrive on a new one, as a retransmission would.
        if (pipe.target.destroyed && held.length > 0) attach(pipe, connect(targetPort, '127.0.0.1'))
        for (const chunk of held) pipe.target.write(chunk)
        for (const chunk of pipe.toClient.splice(0)) if (!pipe.clientGone) pipe.client.write(chunk)
        if (pipe.target.destroyed) {
          pipe.client.destroy()
          pipes.delete(pipe)
        }
      }
    },
    held: () => [...pipes].reduce((n, p) => n + [...p.toTarget, ...p.toClient].reduce((m, c) => m + c.length, 0), 0),
    close: () => new Promise((resolve) => {
      for (const p of pipes) {
        p.client.destroy()
        p.target.destroy()
      }
      server.close(() => resolve())
    }),
  }
}
