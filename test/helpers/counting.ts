import type { Db } from '../../src/store/db.js'

/** Counts statements sent to the database: one call is one round trip. */
export function counting(db: Db): Db & { count: number } {
  const wrapped = {
    ...db,
    count: 0,
    sql(strings: TemplateStringsArray, ...values: Parameters<Db['sql']>[1][]) {
      wrapped.count++
      return db.sql(strings, ...values)
    },
  }
  return wrapped as Db & { count: number }
}
