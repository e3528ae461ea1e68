import { createHash } from 'node:crypto'
import type { Digest } from '../../http/body.js'

/**
 * SHA-256 through node:crypto: synchronous and about a tenth of the CPU of a
 * Web Crypto digest in Node (which queues a thread-pool job per call). Same
 * output as `sha256Hex`; the Node gateway injects it into the core.
 *
 * @example
 * nodeSha256Hex(new TextEncoder().encode('abc')) // 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad'
 */
export const nodeSha256Hex: Digest = (bytes) => createHash('sha256').update(bytes).digest('hex')
