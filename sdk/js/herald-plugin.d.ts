// Types of herald-plugin.js, the JavaScript SDK for Herald plugins
// (herald:plugin@0.2.0, sdk/wit/herald.wit). WIT names are camelCase,
// `option<T>` is `T | undefined`, `list<u8>` is Uint8Array, `u64` is bigint.

/** A connection attempt, as the host saw it. */
export interface ConnectRequest {
  tenant: string;
  /** "ws" or "sse". */
  transport: string;
  /** origin, user-agent, referer, x-forwarded-for, x-real-ip,
   * accept-language when present; names in lower case. */
  headers: Array<[string, string]>;
  /** Query parameters, without `token`. */
  query: Array<[string, string]>;
  /** The token the client presented (Bearer header, `herald_token` cookie
   * or `token` query parameter), if any. */
  credentials?: string;
  remoteAddr: string;
}

/** Who a connection is, as later hooks receive it. */
export interface Session {
  /** 1-256 bytes. */
  subject: string;
  /** 1-64 bytes; none receives only messages without an audience. */
  audience?: string;
  /** At most 32 pairs, each name and value at most 256 bytes. */
  attributes: Array<[string, string]>;
}

/** What `authorizeConnect` may return: `attributes` may be omitted or given
 * as an object (its entries, in order), `audience` may be null. */
export interface SessionInit {
  subject: string;
  audience?: string | null;
  attributes?: Array<readonly [string, string] | string[]> | Record<string, string>;
}

/** One record from the tenant's source. */
export interface SourceRecord {
  timestampMs: bigint;
  position: bigint;
  key?: Uint8Array;
  value: Uint8Array;
  /** The channel the publisher named, if any. */
  channel?: string;
  headers: Array<[string, Uint8Array]>;
}

/** Bytes as the SDK accepts them: a string is encoded as UTF-8. */
export type BytesLike = string | Uint8Array | ArrayBufferView | ArrayBuffer | number[];

/** A message to publish, as `transform` returns it. */
export interface OutgoingInit {
  /** 1-128 characters of `[A-Za-z0-9_.:@-]`. */
  channel: string;
  /** At most the tenant's `limits.max_message_bytes`; sent as JSON when it
   * parses as JSON. */
  payload: BytesLike;
  /** Messages with the same key on one channel are conflated. 1-128 bytes. */
  conflationKey?: string | null;
  /** Only sessions of this audience receive it. 1-64 bytes. */
  audience?: string | null;
  /** The index of the record it came from, in the call's list. */
  sourceIndex: number;
}

export interface Hooks {
  authorizeConnect: boolean;
  authorizeSubscribe: boolean;
  transform: boolean;
  transformFlat: boolean;
  merge: boolean;
}

export interface Info {
  name: string;
  version: string;
  hooks: Hooks;
}

export interface PluginDefinition {
  /** 1-64 bytes. */
  name: string;
  /** Default "0.0.0". */
  version?: string;
  /** Return the session, or throw `new Deny(code, message)`. */
  authorizeConnect?(req: ConnectRequest): SessionInit;
  /** Return to allow, throw `new Deny(code, message)` to refuse. */
  authorizeSubscribe?(session: Session, channel: string): void;
  /** At most 512 records per call; any number of messages per record. */
  transform?(records: SourceRecord[]): OutgoingInit[];
  /** Combines two messages with the same conflation key. */
  merge?(key: string, older: Uint8Array, newer: Uint8Array): BytesLike;
}

/** The object componentize-js binds to the `herald:plugin/guest` export. */
export interface Guest {
  describe(): Info;
  authorizeConnect(req: ConnectRequest): unknown;
  authorizeSubscribe(session: Session, channel: string): unknown;
  transform(records: SourceRecord[]): unknown[];
  transformFlat(batch: { data: Uint8Array; meta: BigUint64Array }): never;
  merge(key: string, older: Uint8Array, newer: Uint8Array): Uint8Array;
}

/** Thrown from an authorize hook to refuse. `code`: `[A-Za-z0-9_]`, at most
 * 48 (the host strips the rest; empty is sent as "denied"); `message`: at
 * most 256 bytes. The client sees both. */
export class Deny extends Error {
  constructor(code: string, message?: string);
  readonly code: string;
  readonly payload: { code: string; message: string };
}

/** Builds the `guest` export; `describe` declares exactly the hooks given.
 * Export the result as `guest`. */
export function definePlugin(def: PluginDefinition): Guest;

/** The tenant's config JSON, parsed once per instance; null when invalid. */
export function config(): any;
/** The tenant's config as the host gave it. */
export function configText(): string;

/** Real wall-clock milliseconds since the Unix epoch (the host's `now-ms`);
 * `Date.now()` is frozen at 0. For token expiry only. */
export function nowMs(): number;

export type Level = "trace" | "debug" | "info" | "warn" | "error";
type LogFn = (...parts: unknown[]) => void;
/** The host's log (16 lines a call, 1 KiB each). */
export const log: ((level: Level, ...parts: unknown[]) => void) & {
  trace: LogFn;
  debug: LogFn;
  info: LogFn;
  warn: LogFn;
  error: LogFn;
};

/** UTF-8 bytes of a string; other BytesLike values as a Uint8Array. */
export function bytes(v: BytesLike): Uint8Array;
/** Strict UTF-8 decoding (a BOM is kept); undefined when invalid. */
export function text(b: Uint8Array | undefined | null): string | undefined;
/** JSON.parse of strict UTF-8 bytes; undefined when not valid UTF-8 JSON. */
export function parseJson(b: Uint8Array | undefined | null): any;
/** The first value of a request header (name case-insensitive). */
export function header(req: ConnectRequest, name: string): string | undefined;
/** The first value of a query parameter. */
export function query(req: ConnectRequest, name: string): string | undefined;
/** The value of a session attribute. */
export function attribute(session: Session, name: string): string | undefined;
/** The value of a record header. */
export function recordHeader(record: SourceRecord, name: string): Uint8Array | undefined;
