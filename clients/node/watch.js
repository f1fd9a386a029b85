#!/usr/bin/env node
// Watches ctxbroker compaction markers and survives daemon restarts.
//
// The contract is loaded at run time from proto/ctxbroker/v1/broker.proto
// (the repository's, or $CTXBROKER_PROTO_DIR, or the package's own copy), so
// this client can never drift from it. The typed client (src/, built to
// dist/) has the same resuming watcher for TypeScript. WatchCompactions replays markers from the durable log,
// sends one `caughtUp` event when the replay is done, then streams new
// markers live; at shutdown the daemon ends the stream with UNAVAILABLE
// and a `resume-from-seq` trailer, and when it is killed the connection
// just drops. `watchMarkers` reconnects with backoff and resumes from the
// last sequence seen + 1, and checks that an unfiltered watch sees every
// sequence exactly once, in order.
//
// As a command it prints one JSON line per marker on stdout and its
// reconnections on stderr:
//
//   node watch.js --addr 127.0.0.1:50051 [--from-seq N | --start oldest|now]
//                 [--session ID]... [--until-seq N] [--max-backoff-ms MS]
//                 [--tls-ca FILE [--tls-cert FILE --tls-key FILE]] [--token TOKEN]
//
// With a bearer token (--token TOKEN, or the environment variable
// CTXBROKER_TOKEN, which keeps it off the command line that `ps` shows) it
// sends `authorization: Bearer <token>` to a daemon that requires tokens.
//
// With --tls-ca it connects over TLS, trusting the CA in FILE (PEM); a
// daemon that asks for client certificates (--tls-client-ca) also needs
// --tls-cert and --tls-key.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

/** Channel options for a daemon that restarts: reconnect within a second
 * (the minimum connect timeout, grpc.min_reconnect_backoff_ms, keeps its
 * 20 s). */
const CHANNEL_OPTIONS = {
  'grpc.initial_reconnect_backoff_ms': 100,
  'grpc.max_reconnect_backoff_ms': 1000,
  'grpc.max_receive_message_length': 64 << 20,
};

/** How messages are turned into objects: 64-bit integers as decimal
 * strings (exact), enums by name, every field present, oneofs named. */
const LOADER_OPTIONS = {
  keepCase: false,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
};

/** The directory holding ctxbroker/v1/broker.proto: $CTXBROKER_PROTO_DIR,
 * else the repository's (in a checkout), else the copy the package ships
 * (made by `npm run build`). */
function protoDir() {
  if (process.env.CTXBROKER_PROTO_DIR) return process.env.CTXBROKER_PROTO_DIR;
  const checkout = path.join(__dirname, '..', '..', 'proto');
  if (fs.existsSync(path.join(checkout, 'ctxbroker', 'v1', 'broker.proto'))) return checkout;
  return path.join(__dirname, 'proto');
}

/** Loads the contract; returns the `ctxbroker.v1` package object. */
function loadContract(dir = protoDir()) {
  const definition = protoLoader.loadSync('ctxbroker/v1/broker.proto', {
    ...LOADER_OPTIONS,
    includeDirs: [dir],
  });
  return grpc.loadPackageDefinition(definition).ctxbroker.v1;
}

/** The channel credentials for `tls` ({ ca, cert, key }: PEM file
 * paths; cert and key only for a daemon that asks for client
 * certificates), or plaintext when `tls` is null. */
function credentials(tls) {
  if (!tls) return grpc.credentials.createInsecure();
  if (!tls.ca) throw new Error('TLS needs the CA file (--tls-ca)');
  if (Boolean(tls.cert) !== Boolean(tls.key)) throw new Error('--tls-cert and --tls-key go together');
  const read = (file) => (file ? fs.readFileSync(file) : null);
  return grpc.credentials.createSsl(read(tls.ca), read(tls.key), read(tls.cert));
}

/** A ContextBroker client for `address` (host:port): plaintext, or over
 * TLS with `tls` (see `credentials`). */
function connect(address, contract = loadContract(), tls = null) {
  return new contract.ContextBroker(address, credentials(tls), CHANNEL_OPTIONS);
}

/** Raised when the daemon sends a marker out of sequence. */
class MarkerSequenceError extends Error {}

function retryable(err) {
  // UNAVAILABLE: down, restarting, or ending streams at shutdown.
  // CANCELLED that this client did not ask for: the connection was torn down.
  return err.code === grpc.status.UNAVAILABLE || err.code === grpc.status.CANCELLED;
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal && signal.aborted) {
      resolve();
      return;
    }
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      if (signal) signal.removeEventListener('abort', done);
      resolve();
    }
    if (signal) signal.addEventListener('abort', done, { once: true });
  });
}

/**
 * Yields compaction markers, resuming across disconnects.
 *
 * options:
 *   fromSeq      first sequence (default 1) when start is 'FROM_SEQ'
 *   start        'FROM_SEQ' (default), 'OLDEST' or 'NOW'
 *   sessionIds   only these sessions' markers (then sequences have gaps)
 *   maxBackoffMs cap of the reconnection backoff (default 2000)
 *   signal       an AbortSignal that ends the iteration
 *   onReconnect  ({nextSeq, code, details, resumeFromSeq}) before each retry
 *   onCaughtUp   (nextSeq) when a replay from the log is done
 *   token        a bearer token, sent as `authorization: Bearer <token>`
 *                to a daemon that requires one (auth_tokens_file)
 */
async function* watchMarkers(client, options = {}) {
  const start = options.start || 'FROM_SEQ';
  const sessionIds = options.sessionIds || [];
  // A tenant's watch delivers its own sessions' markers only: with a
  // token, as with a session filter, sequences have gaps by design.
  const filtered = sessionIds.length > 0 || Boolean(options.token);
  const maxBackoffMs = options.maxBackoffMs ?? 2000;
  const signal = options.signal;
  let nextSeq = start === 'FROM_SEQ' ? BigInt(Math.max(Number(options.fromSeq ?? 1), 1)) : null;
  let backoffMs = 50;
  const metadata = new grpc.Metadata();
  if (options.token) metadata.set('authorization', `Bearer ${options.token}`);

  while (!(signal && signal.aborted)) {
    const request =
      nextSeq !== null
        ? { fromSeq: nextSeq.toString(), start: 'WATCH_START_FROM_SEQ', sessionIds }
        : { start: `WATCH_START_${start}`, sessionIds };
    // Not waitForReady: while the daemon is unreachable the call fails at
    // once and the backoff here governs.
    const call = client.WatchCompactions(request, metadata);
    const cancel = () => call.cancel();
    if (signal) signal.addEventListener('abort', cancel, { once: true });
    let failure = null;
    try {
      for await (const reply of call) {
        if (reply.event === 'marker') {
          const marker = reply.marker;
          const seq = BigInt(marker.seq);
          if (nextSeq !== null && (seq < nextSeq || (seq > nextSeq && !filtered))) {
            throw new MarkerSequenceError(`expected marker ${nextSeq}, the daemon sent ${seq}`);
          }
          nextSeq = seq + 1n;
          backoffMs = 50;
          yield marker;
        } else if (reply.event === 'caughtUp') {
          const seq = BigInt(reply.caughtUp.nextSeq);
          if (nextSeq !== null && (seq < nextSeq || (seq > nextSeq && !filtered))) {
            throw new MarkerSequenceError(`caught up at ${seq}, but the next marker due is ${nextSeq}`);
          }
          nextSeq = seq;
          if (options.onCaughtUp) options.onCaughtUp(nextSeq);
        }
      }
    } catch (err) {
      if (err instanceof MarkerSequenceError) throw err;
      if (signal && signal.aborted) return;
      if (typeof err.code !== 'number' || !retryable(err)) throw err;
      failure = err;
    } finally {
      if (signal) signal.removeEventListener('abort', cancel);
      call.cancel();
    }
    if (signal && signal.aborted) return;
    if (options.onReconnect) {
      const hint = failure && failure.metadata ? failure.metadata.get('resume-from-seq') : [];
      options.onReconnect({
        nextSeq,
        code: failure ? failure.code : null,
        details: failure ? failure.details : 'stream ended',
        resumeFromSeq: hint.length > 0 ? BigInt(String(hint[0])) : null,
      });
    }
    await sleep(backoffMs * (0.8 + 0.4 * Math.random()), signal);
    backoffMs = Math.min(backoffMs * 2, maxBackoffMs);
  }
}

/** A marker as one flat JSON object (sequences as numbers). */
function markerJson(marker) {
  const number = (value) => {
    const n = Number(value);
    return Number.isSafeInteger(n) ? n : String(value);
  };
  return {
    seq: number(marker.seq),
    session_id: marker.sessionId,
    session_seq: number(marker.sessionSeq),
    trigger: marker.trigger,
    outcome: marker.outcome,
    tokens_before: marker.tokensBefore,
    tokens_after: marker.tokensAfter,
    incoming_tokens: marker.incomingTokens,
    evicted_span_ids: marker.evictedSpanIds.map(number),
    summary_span_id: marker.summarySpanId == null ? null : number(marker.summarySpanId),
    pinned_retained: marker.pinnedRetained,
    pinned_total: marker.pinnedTotal,
    actor: marker.actor,
  };
}

function parseArgs(argv) {
  const args = {
    addr: null,
    fromSeq: 1,
    start: 'FROM_SEQ',
    sessionIds: [],
    untilSeq: null,
    maxBackoffMs: 2000,
    tls: null,
    token: process.env.CTXBROKER_TOKEN || null,
  };
  const tls = () => {
    args.tls = args.tls || {};
    return args.tls;
  };
  for (let i = 0; i < argv.length; i += 1) {
    const flag = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${flag} needs a value`);
      i += 1;
      return argv[i];
    };
    if (flag === '--addr') args.addr = value();
    else if (flag === '--from-seq') args.fromSeq = Number(value());
    else if (flag === '--start') args.start = value().toUpperCase().replace('-', '_');
    else if (flag === '--session') args.sessionIds.push(value());
    else if (flag === '--until-seq') args.untilSeq = BigInt(value());
    else if (flag === '--max-backoff-ms') args.maxBackoffMs = Number(value());
    else if (flag === '--token') args.token = value();
    else if (flag === '--tls-ca') tls().ca = value();
    else if (flag === '--tls-cert') tls().cert = value();
    else if (flag === '--tls-key') tls().key = value();
    else throw new Error(`unknown flag ${flag}`);
  }
  if (!args.addr) throw new Error('--addr host:port is required');
  if (!['FROM_SEQ', 'OLDEST', 'NOW'].includes(args.start)) throw new Error('--start is from-seq, oldest or now');
  if (!Number.isInteger(args.fromSeq) || args.fromSeq < 0) throw new Error('--from-seq is a sequence number');
  return args;
}

async function main(argv) {
  let args;
  try {
    args = parseArgs(argv);
  } catch (err) {
    process.stderr.write(`watch.js: ${err.message}\n`);
    return 2;
  }
  let client;
  try {
    client = connect(args.addr, loadContract(), args.tls);
  } catch (err) {
    process.stderr.write(`watch.js: ${err.message}\n`);
    return 2;
  }
  const stop = new AbortController();
  for (const sig of ['SIGINT', 'SIGTERM']) process.once(sig, () => stop.abort());
  const log = (event) => process.stderr.write(`${JSON.stringify(event)}\n`);
  try {
    for await (const marker of watchMarkers(client, {
      fromSeq: args.fromSeq,
      start: args.start,
      sessionIds: args.sessionIds,
      maxBackoffMs: args.maxBackoffMs,
      signal: stop.signal,
      token: args.token,
      onCaughtUp: (nextSeq) => log({ event: 'caught_up', next_seq: Number(nextSeq) }),
      onReconnect: (r) =>
        log({
          event: 'reconnect',
          next_seq: r.nextSeq === null ? null : Number(r.nextSeq),
          code: r.code,
          details: r.details,
          resume_from_seq: r.resumeFromSeq === null ? null : Number(r.resumeFromSeq),
        }),
    })) {
      process.stdout.write(`${JSON.stringify(markerJson(marker))}\n`);
      if (args.untilSeq !== null && BigInt(marker.seq) >= args.untilSeq) break;
    }
    return 0;
  } catch (err) {
    process.stderr.write(`watch.js: ${err.code !== undefined ? `code ${err.code}: ` : ''}${err.details || err.message}\n`);
    return 1;
  } finally {
    client.close();
  }
}

module.exports = { CHANNEL_OPTIONS, MarkerSequenceError, connect, credentials, loadContract, markerJson, protoDir, watchMarkers };

if (require.main === module) {
  main(process.argv.slice(2)).then((code) => {
    process.exitCode = code;
  });
}
