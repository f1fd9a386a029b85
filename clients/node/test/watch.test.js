// The watcher against the real daemon: it resumes across a kill -9 and an
// orderly restart without a gap or a repeat, agrees with what Admit
// replied, and the command prints the same markers as JSON lines.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { spawn } = require('node:child_process');
const grpc = require('@grpc/grpc-js');
const { connect, watchMarkers } = require('../watch.js');
const { Daemon, unary } = require('./daemon.js');

// 83 tokens of tool output; after a 12-token constraint, a 400-token
// window (budget 340, soft watermark 306) compacts at the fourth admission
// and at every one after it, each time back to 298 live tokens, below the
// soft watermark (so no background compaction interleaves).
function toolOutput(i) {
  return (
    `kubectl -n staging apply -f k8s/staging/deploy-${i}.yaml: deployment.apps/web-${i} configured. ` +
    `error: timed out waiting for rollout of web-${i} after 300s; replicas 2/3 ready, image ` +
    `registry.local/web:1.4.${i} pulled in 12s, probe /healthz failing on port 8080 with status 503 ` +
    'Service Unavailable.'
  );
}

async function createSession(client, sessionId) {
  await unary(client, 'CreateSession', { sessionId, config: { windowTokens: 400 } });
  const reply = await unary(client, 'Admit', {
    sessionId,
    spans: [{ role: 'ROLE_USER', text: 'Never write to the `prod` namespace; stage only.' }],
  });
  assert.equal(reply.spans[0].spanClass, 'SPAN_CLASS_CONSTRAINT');
}

async function admitTool(client, sessionId, i) {
  return unary(client, 'Admit', { sessionId, spans: [{ role: 'ROLE_TOOL', text: toolOutput(i) }] });
}

/** Consumes a watch in the background; `until(n)` resolves once markers up
 * to seq n arrived (or rejects if the watch fails first). */
function collect(client, options) {
  const markers = [];
  const reconnects = [];
  const stop = new AbortController();
  let waiter = null;
  const done = (async () => {
    for await (const marker of watchMarkers(client, {
      ...options,
      signal: stop.signal,
      maxBackoffMs: 500,
      onReconnect: (r) => reconnects.push(r),
    })) {
      markers.push(marker);
      if (waiter && BigInt(marker.seq) >= waiter.seq) waiter.resolve();
    }
  })();
  done.catch((err) => waiter && waiter.reject(err));
  return {
    markers,
    reconnects,
    until(seq, timeoutMs = 30_000) {
      const last = markers.length ? BigInt(markers[markers.length - 1].seq) : 0n;
      if (last >= BigInt(seq)) return Promise.resolve();
      return new Promise((resolve, reject) => {
        const timer = setTimeout(
          () => reject(new Error(`watch saw ${markers.map((m) => m.seq)} but not ${seq} within ${timeoutMs} ms`)),
          timeoutMs,
        );
        waiter = {
          seq: BigInt(seq),
          resolve: () => {
            clearTimeout(timer);
            resolve();
          },
          reject: (err) => {
            clearTimeout(timer);
            reject(err);
          },
        };
      });
    },
    async stop() {
      stop.abort();
      await done;
    },
  };
}

test('the watcher resumes across kill -9 and SIGTERM restarts with every marker once', async (t) => {
  const daemon = new Daemon();
  await daemon.start();
  t.after(() => daemon.stop());
  const client = connect(daemon.address);
  t.after(() => client.close());

  await createSession(client, 'node-demo');
  const watch = collect(client, { fromSeq: 1 });
  const fromAdmit = new Map();
  const admitRange = async (from, to) => {
    for (let i = from; i <= to; i += 1) {
      const reply = await admitTool(client, 'node-demo', i);
      assert.ok(reply.totals.liveTokens <= reply.totals.budgetTokens, 'live stays under the budget');
      if (reply.compaction) fromAdmit.set(reply.compaction.seq, reply.compaction);
    }
  };

  await admitRange(1, 5); // markers 1 and 2 (admissions 4 and 5)
  await watch.until(2);
  await daemon.restartKill();
  await admitRange(6, 8); // markers 3..5, admitted while the watcher reconnects
  await watch.until(5);
  await daemon.restartTerm();
  await admitRange(9, 10);

  const info = await unary(client, 'GetServerInfo', {});
  const last = Number(info.nextMarkerSeq) - 1;
  assert.equal(last, 7, 'seven admissions past a full window make seven markers');
  await watch.until(last);
  await watch.stop();

  const seqs = watch.markers.map((m) => Number(m.seq));
  assert.deepEqual(seqs, Array.from({ length: last }, (_, i) => i + 1), 'contiguous from 1, no repeat');
  assert.equal(fromAdmit.size, last, 'every admission past the window carried its marker');
  for (const marker of watch.markers) {
    const replied = fromAdmit.get(marker.seq);
    assert.ok(replied, `marker ${marker.seq} was carried by an Admit reply`);
    assert.equal(marker.sessionId, 'node-demo');
    assert.equal(marker.trigger, 'COMPACTION_TRIGGER_HARD_BUDGET');
    assert.equal(marker.outcome, 'COMPACTION_OUTCOME_COMMITTED');
    assert.equal(marker.tokensBefore, replied.tokensBefore);
    assert.equal(marker.tokensAfter, replied.tokensAfter);
    assert.ok(marker.tokensAfter < marker.tokensBefore + marker.incomingTokens, 'a compaction freed tokens');
    assert.deepEqual(marker.evictedSpanIds, replied.evictedSpanIds);
  }
  assert.ok(watch.reconnects.length >= 2, `reconnected after each restart (${watch.reconnects.length})`);
  // The orderly shutdown ended the stream with the sequence to resume from,
  // and it was the watcher's own.
  const orderly = watch.reconnects.filter((r) => r.resumeFromSeq !== null);
  assert.ok(orderly.length >= 1, 'SIGTERM ended the stream with resume-from-seq');
  for (const r of orderly) assert.equal(r.resumeFromSeq, r.nextSeq);
});

test('the command prints each marker as a JSON line and stops at --until-seq', async (t) => {
  const daemon = new Daemon();
  await daemon.start();
  t.after(() => daemon.stop());
  const client = connect(daemon.address);
  t.after(() => client.close());
  await createSession(client, 'cli');
  for (let i = 1; i <= 6; i += 1) await admitTool(client, 'cli', i);

  const child = spawn(process.execPath, [path.join(__dirname, '..', 'watch.js'), '--addr', daemon.address, '--from-seq', '2', '--until-seq', '3'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (err += d));
  const code = await new Promise((resolve) => child.once('exit', resolve));
  assert.equal(code, 0, err);
  const lines = out.trim().split('\n').map((l) => JSON.parse(l));
  assert.deepEqual(lines.map((l) => l.seq), [2, 3]);
  for (const line of lines) {
    assert.equal(line.session_id, 'cli');
    assert.equal(line.trigger, 'COMPACTION_TRIGGER_HARD_BUDGET');
    assert.ok(line.evicted_span_ids.length > 0);
    assert.ok(line.summary_span_id > 0);
  }
});

test('a watch below retention fails with OUT_OF_RANGE instead of skipping', async (t) => {
  const daemon = new Daemon(['--marker-retention', '2']);
  await daemon.start();
  t.after(() => daemon.stop());
  const client = connect(daemon.address);
  t.after(() => client.close());
  await createSession(client, 'old');
  for (let i = 1; i <= 8; i += 1) await admitTool(client, 'old', i);
  const info = await unary(client, 'GetServerInfo', {});
  assert.ok(Number(info.oldestMarkerSeq) > 1, `retention dropped old markers (oldest ${info.oldestMarkerSeq})`);

  await assert.rejects(
    async () => {
      for await (const marker of watchMarkers(client, { fromSeq: 1 })) assert.fail(`got marker ${marker.seq}`);
    },
    (err) => {
      assert.equal(err.code, grpc.status.OUT_OF_RANGE);
      assert.equal(err.metadata.get('oldest-seq')[0], String(info.oldestMarkerSeq));
      return true;
    },
  );
});
