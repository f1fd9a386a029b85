// The watcher against a scripted server that breaks the contract: it must
// resume from the right sequence and refuse a gap or a repeat instead of
// passing it on. (The real daemon is in watch.test.js.)
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');
const { MarkerSequenceError, connect, loadContract, watchMarkers } = require('../watch.js');

const contract = loadContract();

const marker = (seq) => ({ marker: { seq: String(seq), sessionId: 's' } });
const caughtUp = (nextSeq) => ({ caughtUp: { nextSeq: String(nextSeq) } });

/** Serves WatchCompactions: the n-th call runs the n-th script. */
async function serve(t, scripts) {
  const requests = [];
  const server = new grpc.Server();
  server.addService(contract.ContextBroker.service, {
    WatchCompactions(call) {
      requests.push(call.request);
      scripts[Math.min(requests.length, scripts.length) - 1](call);
    },
  });
  const port = await new Promise((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  const client = connect(`127.0.0.1:${port}`, contract);
  t.after(() => {
    client.close();
    server.forceShutdown();
  });
  return { client, requests };
}

function unavailable(call, resumeFrom) {
  const metadata = new grpc.Metadata();
  if (resumeFrom !== undefined) metadata.set('resume-from-seq', String(resumeFrom));
  call.emit('error', { code: grpc.status.UNAVAILABLE, details: 'the server is shutting down', metadata });
}

async function take(iterator, n) {
  const out = [];
  for (let i = 0; i < n; i += 1) {
    const next = await iterator.next();
    assert.ok(!next.done, `the watch ended after ${out.length} markers`);
    out.push(Number(next.value.seq));
  }
  await iterator.return();
  return out;
}

test('resumes from the last seq + 1 and reports the resume hint', async (t) => {
  const { client, requests } = await serve(t, [
    (call) => {
      call.write(marker(1));
      call.write(caughtUp(2));
      call.write(marker(2));
      unavailable(call, 3);
    },
    (call) => {
      call.write(caughtUp(call.request.fromSeq));
      call.write(marker(3));
    },
  ]);
  const reconnects = [];
  const seqs = await take(watchMarkers(client, { fromSeq: 1, maxBackoffMs: 100, onReconnect: (r) => reconnects.push(r) }), 3);
  assert.deepEqual(seqs, [1, 2, 3]);
  assert.deepEqual(
    requests.map((r) => [r.start, r.fromSeq]),
    [
      ['WATCH_START_FROM_SEQ', '1'],
      ['WATCH_START_FROM_SEQ', '3'],
    ],
  );
  assert.equal(reconnects.length, 1);
  assert.equal(reconnects[0].resumeFromSeq, 3n);
  assert.equal(reconnects[0].nextSeq, 3n);
});

test('a stream that ends without a status is resumed', async (t) => {
  const { client, requests } = await serve(t, [
    (call) => {
      call.write(marker(5));
      call.end();
    },
    (call) => call.write(marker(Number(call.request.fromSeq))),
  ]);
  assert.deepEqual(await take(watchMarkers(client, { fromSeq: 5, maxBackoffMs: 100 }), 2), [5, 6]);
  assert.deepEqual(requests.map((r) => r.fromSeq), ['5', '6']);
});

for (const sent of [[1, 2, 4], [1, 2, 2], [1, 3]]) {
  test(`refuses the sequence ${sent.join(', ')}`, async (t) => {
    const { client } = await serve(t, [(call) => sent.forEach((seq) => call.write(marker(seq)))]);
    await assert.rejects(take(watchMarkers(client, { fromSeq: 1 }), sent.length), MarkerSequenceError);
  });
}

test('a resume that replays old markers is refused', async (t) => {
  const { client } = await serve(t, [
    (call) => {
      call.write(marker(1));
      call.write(marker(2));
      unavailable(call);
    },
    (call) => call.write(marker(1)),
  ]);
  await assert.rejects(take(watchMarkers(client, { fromSeq: 1, maxBackoffMs: 100 }), 3), /expected marker 3/);
});

test('OUT_OF_RANGE is raised, not retried', async (t) => {
  const { client, requests } = await serve(t, [
    (call) => call.emit('error', { code: grpc.status.OUT_OF_RANGE, details: 'below retention' }),
  ]);
  await assert.rejects(take(watchMarkers(client, { fromSeq: 1 }), 1), (err) => err.code === grpc.status.OUT_OF_RANGE);
  assert.equal(requests.length, 1);
});
