import { describe, expect, it } from 'vitest'
import { ConfigError } from '../src/config/schema.js'
import { readStoreHosts } from '../src/store/primary.js'

describe('the hosts of a store URL', () => {
  it.each([
    ['postgres://fg@db1:5432/fencegate', [{ host: 'db1', port: 5432 }], 'postgres://fg@db1:5432/fencegate', 'any'],
    ['postgres://fg:pw@db1:5433,db2/fencegate?sslmode=require', [{ host: 'db1', port: 5433 }, { host: 'db2', port: 5432 }], 'postgres://fg:pw@db1:5433/fencegate?sslmode=require', 'read-write'],
    ['postgresql://fg@db1,db2:6000/fg?target_session_attrs=primary&application_name=x', [{ host: 'db1', port: 5432 }, { host: 'db2', port: 6000 }], 'postgresql://fg@db1/fg?application_name=x', 'primary'],
    ['postgres://fg@[::1]:5432,[::1]:5433/fg?target_session_attrs=read-write', [{ host: '::1', port: 5432 }, { host: '::1', port: 5433 }], 'postgres://fg@[::1]:5432/fg', 'read-write'],
  ])('%s', (url, hosts, single, attrs) => {
    expect(readStoreHosts(url)).toEqual({ hosts, url: single, attrs })
  })

  it('refuses at start a target_session_attrs no write can go through, naming store.url', () => {
    for (const attrs of ['read-only', 'standby', 'prefer-standby']) {
      expect(() => readStoreHosts(`postgres://db1,db2/fg?target_session_attrs=${attrs}`)).toThrow(ConfigError)
      expect(() => readStoreHosts(`postgres://db1,db2/fg?target_session_attrs=${attrs}`)).toThrow(/store\.url/)
    }
  })
})
