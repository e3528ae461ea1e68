/** Who sent a request: the tenant scopes every fence, key and audit row. */
export interface Identity {
  tenant: string
  /** The caller's subject, when known; written to audit rows. */
  caller: string | null
}

/** The single tenant of a gateway without authentication. */
export const defaultIdentity: Identity = Object.freeze({ tenant: 'default', caller: null })

/** Without authentication every request belongs to tenant `default`. */
export function resolveIdentity(_request: Request): Identity {
  return defaultIdentity
}
