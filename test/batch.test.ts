import { describe, expect, it } from 'vitest'
import { createBatcher } from '../src/store/batch.js'
import { StoreError } from '../src/store/db.js'

// The batcher's own rules, over a write that fails as PostgreSQL does. The statements
// behind real batches are tested on both stores in completions and leases-complete.
describe('createBatcher', () => {
  it('writes a batch PostgreSQL rolled back for a deadlock again item by item (a lease bench run died of an unretried 40P01)', async () => {
    const written: number[][] = []
    const batcher = createBatcher<number, string>({
      write: async (items) => {
        written.push(items)
        if (items.length > 1) throw new StoreError('40P01', undefined)
        return items.map((i) => `done ${i}`)
      },
    })
    expect(await Promise.all([batcher.add(1), batcher.add(2), batcher.add(3)])).toEqual(['done 1', 'done 2', 'done 3'])
    expect(written).toEqual([[1, 2, 3], [1], [2], [3]])
  })

  it('fails the whole batch at once on a failure that is not the rows\' nor a rollback', async () => {
    let writes = 0
    const batcher = createBatcher<number, string>({
      write: async () => {
        writes++
        throw new StoreError('08006', undefined)
      },
    })
    const results = await Promise.allSettled([batcher.add(1), batcher.add(2)])
    expect(results.map((r) => r.status)).toEqual(['rejected', 'rejected'])
    expect(writes).toBe(1)
  })
})
