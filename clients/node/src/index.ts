// The typed ctxbroker client: every RPC of `ctxbroker.v1.ContextBroker` on
// @grpc/grpc-js, with promises for unary calls, async iterables for
// streams, a bearer token, TLS, per-call deadlines, the session routing
// header, typed errors, idempotent retries of Admit, and a resuming marker
// watcher. The message types are generated from proto/ by ts-proto
// (`npm run build`).
import { randomUUID } from 'node:crypto';
import * as fs from 'node:fs';

import {
  CallOptions,
  ChannelCredentials,
  ChannelOptions,
  ClientDuplexStream,
  Metadata,
  credentials as grpcCredentials,
  status as Status,
} from '@grpc/grpc-js';

import * as pb from './gen/ctxbroker/v1/broker';
import { BrokerError } from './errors';

export * from './errors';
export { pb };
export type { DeepPartial } from './gen/ctxbroker/v1/broker';
type DeepPartial<T> = pb.DeepPartial<T>;

/** The metadata key the session-affine routes (Envoy's ring hash) read. */
export const SESSION_HEADER = 'x-ctxbroker-session';

/** How Admit retries a call that may not have reached the daemon. */
export interface RetryPolicy {
  /** Attempts in all, the first included (1 = never retry). */
  attempts: number;
  /** The first wait; each next one doubles, with jitter. */
  initialBackoffMs: number;
  /** The longest wait. */
  maxBackoffMs: number;
}

/** The default: 4 attempts, 100 ms doubling to 2 s. */
export const DEFAULT_RETRY: RetryPolicy = { attempts: 4, initialBackoffMs: 100, maxBackoffMs: 2000 };

/** TLS: the CA to trust, and a client certificate for mTLS. PEM text or
 * file paths. */
export interface TlsOptions {
  ca?: string | Buffer;
  caFile?: string;
  cert?: string | Buffer;
  certFile?: string;
  key?: string | Buffer;
  keyFile?: string;
}

/** How to reach the daemon. */
export interface BrokerOptions {
  /** A bearer token (the daemon's `--auth-tokens-file`). */
  token?: string;
  /** Connect over TLS. */
  tls?: TlsOptions;
  /** Deadline of each unary call, in ms (default 30 s). Streams have none. */
  deadlineMs?: number;
  /** Admit's retries (default {@link DEFAULT_RETRY}). */
  retry?: RetryPolicy;
  /** Extra channel options for @grpc/grpc-js. */
  channelOptions?: ChannelOptions;
  /** Interceptors for every call (@grpc/grpc-js `interceptors`). */
  interceptors?: CallOptions['interceptors'];
}

/** Per-call options. */
export interface CallSettings {
  /** This call's deadline in ms, instead of the client's. */
  deadlineMs?: number;
  /** Extra metadata to send. */
  metadata?: Metadata;
}

/** Channel options for a daemon that restarts: reconnect within a second. */
export const CHANNEL_OPTIONS: ChannelOptions = {
  'grpc.initial_reconnect_backoff_ms': 100,
  'grpc.max_reconnect_backoff_ms': 1000,
  'grpc.max_receive_message_length': 64 * 1024 * 1024,
};

function pem(text: string | Buffer | undefined, file: string | undefined): Buffer | undefined {
  if (text !== undefined) return Buffer.isBuffer(text) ? text : Buffer.from(text);
  if (file !== undefined) return fs.readFileSync(file);
  return undefined;
}

/** Channel credentials for `tls` (insecure when absent). */
export function channelCredentials(tls?: TlsOptions): ChannelCredentials {
  if (!tls) return grpcCredentials.createInsecure();
  const cert = pem(tls.cert, tls.certFile);
  const key = pem(tls.key, tls.keyFile);
  return grpcCredentials.createSsl(pem(tls.ca, tls.caFile) ?? null, key ?? null, cert ?? null);
}

type UnaryMethod =
  | 'createSession'
  | 'getSession'
  | 'listSessions'
  | 'updateSession'
  | 'deleteSession'
  | 'admit'
  | 'getContext'
  | 'getSpan'
  | 'searchSpans'
  | 'listSpans'
  | 'planCompaction'
  | 'commitCompaction'
  | 'pin'
  | 'unpin'
  | 'selectTrigger'
  | 'getServerInfo'
  | 'exportSession'
  | 'importSession'
  | 'retractLastTurn'
  | 'resetSession';

type UnaryCall = (
  request: unknown,
  metadata: Metadata,
  options: Partial<CallOptions>,
  callback: (error: unknown, response: unknown) => void,
) => unknown;

/** A client of one daemon. */
export class Broker {
  /** The generated client, for anything this class does not wrap. */
  readonly raw: pb.ContextBrokerClient;
  private readonly token: string | undefined;
  private readonly deadlineMs: number;
  private readonly retry: RetryPolicy;
  private readonly interceptors: CallOptions['interceptors'];

  /** `address` is `host:port` (or any grpc-js target, e.g. `unix:/path`). */
  constructor(address: string, options: BrokerOptions = {}) {
    this.raw = new pb.ContextBrokerClient(address, channelCredentials(options.tls), {
      ...CHANNEL_OPTIONS,
      ...options.channelOptions,
    });
    this.token = options.token;
    this.deadlineMs = options.deadlineMs ?? 30_000;
    this.retry = options.retry ?? DEFAULT_RETRY;
    this.interceptors = options.interceptors;
  }

  /** Closes the channel. */
  close(): void {
    this.raw.close();
  }

  /** The metadata of a call: the token, and the routing header for a call
   * about one session. */
  metadata(sessionId?: string, extra?: Metadata): Metadata {
    const metadata = extra ? extra.clone() : new Metadata();
    if (this.token !== undefined) metadata.set('authorization', `Bearer ${this.token}`);
    if (sessionId) metadata.set(SESSION_HEADER, sessionId);
    return metadata;
  }

  private options(settings?: CallSettings, stream = false): Partial<CallOptions> {
    const options: Partial<CallOptions> = {};
    if (!stream || settings?.deadlineMs !== undefined) {
      options.deadline = Date.now() + (settings?.deadlineMs ?? this.deadlineMs);
    }
    if (this.interceptors) options.interceptors = this.interceptors;
    return options;
  }

  private unary<Res>(
    method: UnaryMethod,
    request: unknown,
    sessionId: string | undefined,
    settings?: CallSettings,
  ): Promise<Res> {
    const call = (this.raw[method] as unknown as UnaryCall).bind(this.raw);
    return new Promise<Res>((resolve, reject) => {
      call(request, this.metadata(sessionId, settings?.metadata), this.options(settings), (error, response) => {
        if (error) reject(BrokerError.from(error));
        else resolve(response as Res);
      });
    });
  }

  /** Creates a session. */
  createSession(request: DeepPartial<pb.CreateSessionRequest>, settings?: CallSettings): Promise<pb.CreateSessionResponse> {
    const message = pb.CreateSessionRequest.fromPartial(request);
    return this.unary('createSession', message, message.sessionId, settings);
  }

  /** One session: configuration and totals. */
  getSession(sessionId: string, settings?: CallSettings): Promise<pb.GetSessionResponse> {
    return this.unary('getSession', pb.GetSessionRequest.fromPartial({ sessionId }), sessionId, settings);
  }

  /** One page of sessions. */
  listSessions(request: DeepPartial<pb.ListSessionsRequest> = {}, settings?: CallSettings): Promise<pb.ListSessionsResponse> {
    return this.unary('listSessions', pb.ListSessionsRequest.fromPartial(request), undefined, settings);
  }

  /** Every session, page by page. */
  async *allSessions(pageSize = 0, settings?: CallSettings): AsyncGenerator<pb.Session> {
    let pageToken = '';
    for (;;) {
      const page = await this.listSessions({ pageSize, pageToken }, settings);
      yield* page.sessions;
      if (!page.nextPageToken || page.nextPageToken === pageToken) return;
      pageToken = page.nextPageToken;
    }
  }

  /** Changes a session's configuration. */
  updateSession(request: DeepPartial<pb.UpdateSessionRequest>, settings?: CallSettings): Promise<pb.UpdateSessionResponse> {
    const message = pb.UpdateSessionRequest.fromPartial(request);
    return this.unary('updateSession', message, message.sessionId, settings);
  }

  /** Deletes a session and everything it holds. */
  deleteSession(sessionId: string, settings?: CallSettings): Promise<pb.DeleteSessionResponse> {
    return this.unary('deleteSession', pb.DeleteSessionRequest.fromPartial({ sessionId }), sessionId, settings);
  }

  /**
   * Takes back the newest `spans` live spans (0: every live span of the
   * newest turn), optionally only if the session is still at
   * `expectedRevision`. An agent's undo of its last item or turn.
   */
  retractLastTurn(
    request: DeepPartial<pb.RetractLastTurnRequest>,
    settings?: CallSettings,
  ): Promise<pb.RetractLastTurnResponse> {
    const message = pb.RetractLastTurnRequest.fromPartial(request);
    return this.unary('retractLastTurn', message, message.sessionId, settings);
  }

  /** Empties a session (live spans, archive, keys), keeping its configuration. */
  resetSession(
    request: DeepPartial<pb.ResetSessionRequest>,
    settings?: CallSettings,
  ): Promise<pb.ResetSessionResponse> {
    const message = pb.ResetSessionRequest.fromPartial(request);
    return this.unary('resetSession', message, message.sessionId, settings);
  }

  /**
   * Admits a turn. Every span gets an idempotency key before the first
   * attempt (the caller's, or `<one random id>.<index>`), so a retry after
   * UNAVAILABLE or DEADLINE_EXCEEDED, when the turn may or may not have
   * landed, can never admit it twice: the daemon answers a repeat with
   * the original spans and `replayed` set. The daemon's own refusals are
   * never retried.
   */
  async admit(
    sessionId: string,
    spans: DeepPartial<pb.SpanInput>[],
    settings?: CallSettings & { retry?: RetryPolicy },
  ): Promise<pb.AdmitResponse> {
    const request = pb.AdmitRequest.fromPartial({ sessionId, spans });
    if (request.spans.every((s) => s.idempotencyKey === '')) {
      const base = randomUUID();
      request.spans.forEach((s, i) => {
        s.idempotencyKey = `${base}.${i}`;
      });
    }
    const retry = settings?.retry ?? this.retry;
    let backoff = retry.initialBackoffMs;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.unary<pb.AdmitResponse>('admit', request, sessionId, settings);
      } catch (error) {
        const e = BrokerError.from(error);
        const mayRetry = e.code === Status.UNAVAILABLE || e.code === Status.DEADLINE_EXCEEDED;
        if (!mayRetry || attempt >= retry.attempts) throw e;
        await sleep(backoff / 2 + Math.random() * (backoff / 2));
        backoff = Math.min(backoff * 2, retry.maxBackoffMs);
      }
    }
  }

  /** The live context in prompt order. */
  getContext(sessionId: string, settings?: CallSettings): Promise<pb.GetContextResponse> {
    return this.unary('getContext', pb.GetContextRequest.fromPartial({ sessionId }), sessionId, settings);
  }

  /** One span, live or archived. */
  getSpan(sessionId: string, spanId: number, settings?: CallSettings): Promise<pb.GetSpanResponse> {
    return this.unary('getSpan', pb.GetSpanRequest.fromPartial({ sessionId, spanId }), sessionId, settings);
  }

  /** Searches a session's spans, archive included. */
  searchSpans(request: DeepPartial<pb.SearchSpansRequest>, settings?: CallSettings): Promise<pb.SearchSpansResponse> {
    const message = pb.SearchSpansRequest.fromPartial(request);
    return this.unary('searchSpans', message, message.sessionId, settings);
  }

  /** Lists a session's spans by filter. */
  listSpans(request: DeepPartial<pb.ListSpansRequest>, settings?: CallSettings): Promise<pb.ListSpansResponse> {
    const message = pb.ListSpansRequest.fromPartial(request);
    return this.unary('listSpans', message, message.sessionId, settings);
  }

  /** Plans a compaction without committing it. */
  planCompaction(request: DeepPartial<pb.PlanCompactionRequest>, settings?: CallSettings): Promise<pb.PlanCompactionResponse> {
    const message = pb.PlanCompactionRequest.fromPartial(request);
    return this.unary('planCompaction', message, message.sessionId, settings);
  }

  /** Commits a plan (after verification). */
  commitCompaction(request: DeepPartial<pb.CommitCompactionRequest>, settings?: CallSettings): Promise<pb.CommitCompactionResponse> {
    const message = pb.CommitCompactionRequest.fromPartial(request);
    return this.unary('commitCompaction', message, message.sessionId, settings);
  }

  /** Pins a span as a constraint. */
  pin(request: DeepPartial<pb.PinRequest>, settings?: CallSettings): Promise<pb.PinResponse> {
    const message = pb.PinRequest.fromPartial(request);
    return this.unary('pin', message, message.sessionId, settings);
  }

  /** Releases a constraint, saying who and why. */
  unpin(request: DeepPartial<pb.UnpinRequest>, settings?: CallSettings): Promise<pb.UnpinResponse> {
    const message = pb.UnpinRequest.fromPartial(request);
    return this.unary('unpin', message, message.sessionId, settings);
  }

  /** The trigger policy the daemon recommends for a workload. */
  selectTrigger(request: DeepPartial<pb.SelectTriggerRequest>, settings?: CallSettings): Promise<pb.SelectTriggerResponse> {
    return this.unary('selectTrigger', pb.SelectTriggerRequest.fromPartial(request), undefined, settings);
  }

  /** Version, contract digest, limits, the marker log's range. */
  getServerInfo(settings?: CallSettings): Promise<pb.GetServerInfoResponse> {
    return this.unary('getServerInfo', pb.GetServerInfoRequest.fromPartial({}), undefined, settings);
  }

  /** A session's self-contained snapshot. */
  exportSession(sessionId: string, settings?: CallSettings): Promise<pb.ExportSessionResponse> {
    return this.unary('exportSession', pb.ExportSessionRequest.fromPartial({ sessionId }), sessionId, settings);
  }

  /** Restores a session from a snapshot. */
  importSession(snapshot: DeepPartial<pb.SessionSnapshot>, settings?: CallSettings): Promise<pb.ImportSessionResponse> {
    const message = pb.ImportSessionRequest.fromPartial({ snapshot });
    return this.unary('importSession', message, message.snapshot?.sessionId, settings);
  }

  /** A pipelined admission stream for one session: send turns with
   * {@link AdmitStream.send}, read replies and markers by iterating. */
  admitStream(sessionId: string, settings?: CallSettings): AdmitStream {
    const call = this.raw.admitStream(this.metadata(sessionId, settings?.metadata), this.options(settings, true));
    return new AdmitStream(sessionId, call);
  }

  /**
   * The compaction markers from `fromSeq` (or `start`), then live ones,
   * for as long as the caller iterates: after a lost connection or a
   * daemon restart it reconnects and resumes after the last marker it
   * yielded. An unfiltered watch checks that every sequence number comes
   * exactly once, in order, and throws {@link MarkerSequenceError} if not.
   */
  async *watchMarkers(options: WatchOptions = {}): AsyncGenerator<pb.CompactionMarker> {
    const sessionIds = options.sessionIds ?? [];
    let next: number | undefined = options.fromSeq;
    let backoff = 100;
    const maxBackoff = options.maxBackoffMs ?? 2000;
    for (;;) {
      const request = pb.WatchCompactionsRequest.fromPartial({
        fromSeq: next ?? 0,
        sessionIds,
        start: next !== undefined ? pb.WatchStart.WATCH_START_FROM_SEQ : (options.start ?? pb.WatchStart.WATCH_START_FROM_SEQ),
      });
      const session = sessionIds.length === 1 ? sessionIds[0] : undefined;
      const call = this.raw.watchCompactions(request, this.metadata(session), this.options(undefined, true));
      try {
        for await (const event of call as AsyncIterable<pb.WatchCompactionsResponse>) {
          if (event.marker) {
            const marker = event.marker;
            if (next !== undefined && sessionIds.length === 0 && marker.seq !== next) {
              call.cancel();
              throw new MarkerSequenceError(next, marker.seq);
            }
            next = marker.seq + 1;
            backoff = 100;
            yield marker;
          } else if (event.caughtUp) {
            if (next === undefined || sessionIds.length === 0) next = Math.max(next ?? 0, event.caughtUp.nextSeq);
            options.onCaughtUp?.(event.caughtUp.nextSeq);
          }
        }
      } catch (error) {
        if (error instanceof MarkerSequenceError) throw error;
        const e = BrokerError.from(error);
        if (e.code !== Status.UNAVAILABLE && e.code !== Status.INTERNAL && e.code !== Status.UNKNOWN) throw e;
        const resume = Number(e.trailers?.get('resume-from-seq')[0] ?? NaN);
        if (Number.isFinite(resume)) next = Math.max(resume, next ?? 0);
        options.onReconnect?.(e, next);
      } finally {
        call.cancel();
      }
      await sleep(backoff);
      backoff = Math.min(backoff * 2, maxBackoff);
    }
  }
}

/** What {@link Broker.watchMarkers} watches. */
export interface WatchOptions {
  /** The first sequence number (1 = the first marker ever). */
  fromSeq?: number;
  /** Where to start without `fromSeq` (`WATCH_START_OLDEST`, `WATCH_START_NOW`). */
  start?: pb.WatchStart;
  /** Only these sessions' markers. */
  sessionIds?: string[];
  /** Called when the replay from the log is done. */
  onCaughtUp?: (nextSeq: number) => void;
  /** Called before each reconnection, with the sequence it resumes from. */
  onReconnect?: (error: BrokerError, resumeFrom: number | undefined) => void;
  /** The longest wait between reconnections (default 2 s). */
  maxBackoffMs?: number;
}

/** An unfiltered watch saw a sequence number out of order. */
export class MarkerSequenceError extends Error {
  constructor(
    readonly expected: number,
    readonly got: number,
  ) {
    super(`expected marker ${expected}, got ${got}`);
    this.name = 'MarkerSequenceError';
  }
}

/** One session's pipelined admission stream. */
export class AdmitStream implements AsyncIterable<pb.AdmitStreamResponse> {
  private nextRequestId = 1;

  constructor(
    readonly sessionId: string,
    readonly call: ClientDuplexStream<pb.AdmitStreamRequest, pb.AdmitStreamResponse>,
  ) {}

  /** Sends a turn; returns its request id, which its reply carries. */
  send(spans: DeepPartial<pb.SpanInput>[]): number {
    const requestId = this.nextRequestId++;
    this.call.write(
      pb.AdmitStreamRequest.fromPartial({ requestId, admit: { sessionId: this.sessionId, spans } }),
    );
    return requestId;
  }

  /** No more turns; the replies still come. */
  end(): void {
    this.call.end();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<pb.AdmitStreamResponse> {
    try {
      for await (const response of this.call as AsyncIterable<pb.AdmitStreamResponse>) yield response;
    } catch (error) {
      throw BrokerError.from(error);
    }
  }
}

/** A span to admit, by role. */
export function user(text: string, extra: DeepPartial<pb.SpanInput> = {}): DeepPartial<pb.SpanInput> {
  return { ...extra, role: pb.Role.ROLE_USER, text };
}
/** An assistant span. */
export function assistant(text: string, extra: DeepPartial<pb.SpanInput> = {}): DeepPartial<pb.SpanInput> {
  return { ...extra, role: pb.Role.ROLE_ASSISTANT, text };
}
/** A tool output span. */
export function tool(text: string, extra: DeepPartial<pb.SpanInput> = {}): DeepPartial<pb.SpanInput> {
  return { ...extra, role: pb.Role.ROLE_TOOL, text };
}
/** A system span. */
export function system(text: string, extra: DeepPartial<pb.SpanInput> = {}): DeepPartial<pb.SpanInput> {
  return { ...extra, role: pb.Role.ROLE_SYSTEM, text };
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
