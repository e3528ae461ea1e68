import { defineConfig } from 'vitest/config'

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/helpers/global-setup.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    pool: 'forks',
    // Most tests wait on PostgreSQL, PGlite or loopback HTTP, not on a core: three files at a time
    // keep CI well inside its budget on two cores.
    maxWorkers: 3,
    reporters: ['default'],
  },
})
