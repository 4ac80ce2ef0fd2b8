// Types of herald.js, the Herald browser client (ES module, no dependencies).

/** WebSocket close codes Herald sends (host/src/proto/ws.rs, `close`). */
export declare const CloseCodes: Readonly<{
  NORMAL: 1000;
  GOING_AWAY: 1001;
  PROTOCOL: 1002;
  UNSUPPORTED: 1003;
  ABNORMAL: 1006;
  BAD_DATA: 1007;
  POLICY: 1008;
  TOO_BIG: 1009;
  SERVICE_RESTART: 1012;
  TRY_AGAIN_LATER: 1013;
  TENANT_GONE: 4000;
  SLOW_CONSUMER: 4001;
  HEARTBEAT_TIMEOUT: 4002;
  DISCONNECTED: 4003;
  REAUTHORIZE: 4004;
}>;

/** The WebSocket subprotocol Herald speaks: `herald.v1`. */
export declare const PROTOCOL: "herald.v1";
/** Prefix of the subprotocol that carries a token: `herald.token.` + base64url(UTF-8), unpadded. */
export declare const TOKEN_PROTOCOL: "herald.token.";

export type Transport = "auto" | "ws" | "sse";
export type TokenVia = "query" | "cookie" | "protocol";
export type ClientState = "idle" | "connecting" | "open" | "reconnecting" | "closed";

export interface HeraldOptions {
  /** Herald's base URL (`http(s)://host:port`; `ws(s)://` works too). Default: the page's origin. */
  url?: string;
  /** Tenant id (path segment of `/v1/t/{tenant}/…`). */
  tenant: string;
  /** The credential the tenant's plugin checks; a function is called before every (re)connect. */
  token?: string | null | (() => string | null | undefined | Promise<string | null | undefined>);
  /**
   * How the token travels. `protocol` (default): WebSocket subprotocol
   * `herald.token.<base64url>` beside `herald.v1`, and `Authorization: Bearer`
   * on SSE. `query`: `?token=` on both. `cookie`: the page sets the
   * `herald_token` cookie; the client sends credentials with its requests.
   */
  tokenVia?: TokenVia;
  /** `auto` (default): WebSocket, falling back to SSE when WebSocket is blocked on the way. */
  transport?: Transport;
  /** Full-jitter exponential backoff: sleep = random(0, min(maxMs, baseMs·2^attempt)). Default 500 / 30000. */
  backoff?: { baseMs?: number; maxMs?: number };
  /** Give up on a handshake (or an SSE response head) after this long. Default 10000. */
  connectTimeoutMs?: number;
  /** WebSocket: send `{"op":"ping"}` when the server was quiet this long (halved). Default 20000. */
  pingIntervalMs?: number;
  /** Reconnect when nothing at all arrived for this long (Herald heartbeats every 25 s). Default 60000. */
  idleTimeoutMs?: number;
  /** A connection open this long resets the backoff when it ends. Default 3000. */
  stableMs?: number;
  /** Connect on the first subscribe() (default true); otherwise call connect(). */
  autoConnect?: boolean;
}

export interface SubscribeOptions {
  /** Resume after this position (a `seq` kept from an earlier session). */
  since?: number;
  /** The epoch `since` belongs to (from an ack or a message's meta). */
  epoch?: number;
}

export interface MessageMeta {
  ch: string;
  seq: number;
  /** The position of the previous message sent to this audience; 0 when none. */
  prev: number;
  /** The channel's epoch (positions only compare within one). */
  epoch: number | null;
  /** `json` (data is the parsed payload) or `base64` (data is the payload's bytes). */
  enc: "json" | "base64";
}

export type MessageHandler = (data: unknown, meta: MessageMeta) => void;

export interface MessageEventDetail extends MessageMeta {
  data: unknown;
}

export interface StatusEventDetail {
  /** The tenant's ingest source kind: `http`, `kafka`, `postgres_outbox`, … */
  source: string;
  state: "live" | "stalled" | string;
  since_ms: number;
  sinceMs: number;
}

export interface GapEventDetail {
  ch: string;
  /** First position that will not be delivered. */
  from: number;
  /** Last one; null when unknown (the channel's epoch changed: its history was lost). */
  to: number | null;
  epoch: number | null;
  /** With reason `epoch`: the epoch the channel goes on in. */
  newEpoch?: number;
  /** `server`: a gap frame; `prev`: a message whose prev is not the last seq seen; `epoch`: a new epoch. */
  reason: "server" | "prev" | "epoch";
}

export interface ErrorEventDetail {
  /** Herald's error code (`invalid_token`, `origin_not_allowed`, `unauthorized`, `forbidden`, …). */
  code: string;
  message: string;
  /** The HTTP status of a refused session request, when one was read. */
  status?: number;
  /** The WebSocket (or SSE `close` event) code that ended a session. */
  closeCode?: number;
  /** True: the client stopped (state `closed`); connect() tries again. */
  fatal: boolean;
  /** Refused cross-origin: the answer was not readable, the code is inferred. */
  inferred?: boolean;
  /** A subscription refusal: its channel and op. */
  ch?: string;
  op?: string;
  transport?: "ws" | "sse";
  retryAfterMs?: number | null;
  retryInMs?: number;
}

export interface OpenEventDetail {
  transport: "ws" | "sse";
  reconnect: boolean;
  /** SSE adopted because the WebSocket handshake failed while SSE works. */
  fallback?: boolean;
}

export interface CloseEventDetail {
  code: number | null;
  status?: number;
  reason: string;
  transport: "ws" | "sse" | null;
  wasOpen: boolean;
  willReconnect: boolean;
  delayMs?: number;
  byClient?: boolean;
}

export interface StateEventDetail {
  state: ClientState;
  prev: ClientState;
  transport: "ws" | "sse" | null;
}

export interface AckEventDetail {
  ch: string;
  epoch: number;
  seq: number;
  op: string;
}

export interface HeraldEventMap {
  message: MessageEventDetail;
  status: StatusEventDetail;
  gap: GapEventDetail;
  error: ErrorEventDetail;
  open: OpenEventDetail;
  close: CloseEventDetail;
  state: StateEventDetail;
  ack: AckEventDetail;
}

export interface Position {
  epoch: number | null;
  seq: number;
}

export interface HeraldStats {
  messages: number;
  duplicates: number;
  gaps: number;
  reconnects: number;
  opens: number;
}

export declare class Herald extends EventTarget {
  constructor(options: HeraldOptions);
  readonly options: Required<Omit<HeraldOptions, "token" | "url">> & Pick<HeraldOptions, "token" | "url">;
  readonly state: ClientState;
  readonly transport: "ws" | "sse" | null;
  readonly lastError: ErrorEventDetail | null;
  readonly channels: string[];
  readonly stats: HeraldStats;
  /** Subscribes; returns a function removing this handler (the subscription with its last one). */
  subscribe(ch: string, handler?: MessageHandler, opts?: SubscribeOptions): () => void;
  /** Leaves the channel (every handler). */
  unsubscribe(ch: string): void;
  /** `fn(detail, event)` for each event of `type`; returns a function that stops listening. */
  on<K extends keyof HeraldEventMap>(type: K, fn: (detail: HeraldEventMap[K], event: CustomEvent<HeraldEventMap[K]>) => void): () => void;
  off<K extends keyof HeraldEventMap>(type: K, fn: (detail: HeraldEventMap[K], event: CustomEvent<HeraldEventMap[K]>) => void): void;
  /** The last position seen on `ch`. */
  position(ch: string): Position | null;
  positions(): Record<string, Position>;
  /** Connects now (or again, after a refusal stopped the client). */
  connect(): void;
  /** Closes for good. */
  close(): void;
}

/** base64url of a string's UTF-8 bytes, unpadded (the token subprotocol's encoding). */
export declare function base64url(text: string): string;
/** Parses Herald's SSE `id:` (`epoch:seq,…` in channel order); null when malformed. */
export declare function parseEventId(id: string): Array<[number, number]> | null;

/** Incremental text/event-stream parser. */
export declare class SseParser {
  constructor(onEvent: (ev: { type: string; data: string; id: string }) => void, onComment?: (text: string) => void);
  lastId: string;
  retry: number | null;
  feed(text: string): void;
}

export default Herald;
