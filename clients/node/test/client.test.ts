// The typed client against the real daemon: every RPC at least once, the
// session routing header on every call about one session, typed errors
// with their details, Admit's retry with the same idempotency keys, and
// the watcher resuming across a kill -9.
import test from 'node:test';
import assert from 'node:assert/strict';

import { InterceptingCall, Interceptor, status as Status } from '@grpc/grpc-js';

import { Broker, BrokerError, SESSION_HEADER, pb, tool, user } from '../src/index';

const { Daemon } = require('../../test/daemon.js') as {
  Daemon: new (args?: string[]) => {
    address: string;
    start(): Promise<void>;
    restartKill(): Promise<void>;
    stop(): Promise<void>;
  };
};

/** 83 tokens of tool output: after a 12-token constraint, a 400-token
 * window compacts at the fourth admission and at every one after it. */
function toolOutput(i: number): string {
  return (
    `kubectl -n staging apply -f k8s/staging/deploy-${i}.yaml: deployment.apps/web-${i} configured. ` +
    `error: timed out waiting for rollout of web-${i} after 300s; replicas 2/3 ready, image ` +
    `registry.local/web:1.4.${i} pulled in 12s, probe /healthz failing on port 8080 with status 503 ` +
    'Service Unavailable.'
  );
}

const CONSTRAINT = 'Never write to the `prod` namespace; stage only.';

/** Records, per method, the session header each call carried; drops the
 * reply of the next Admit when `dropNextAdmit` is set (the daemon has
 * admitted the turn, the caller sees UNAVAILABLE). */
class Recorder {
  readonly headers: Array<[string, string | undefined]> = [];
  dropNextAdmit = false;

  interceptor: Interceptor = (options, nextCall) => {
    const method = String(options.method_definition.path).split('/').pop() ?? '';
    return new InterceptingCall(nextCall(options), {
      start: (metadata, listener, next) => {
        const value = metadata.get(SESSION_HEADER)[0];
        this.headers.push([method, value === undefined ? undefined : String(value)]);
        const drop = method === 'Admit' && this.dropNextAdmit;
        if (drop) this.dropNextAdmit = false;
        // The reply's message still reaches grpc-js (which holds the
        // status until a received message is processed), but a status
        // other than OK makes the call fail with it: the reply is lost.
        next(metadata, {
          onReceiveStatus: (status, nextStatus) => {
            nextStatus(drop ? { ...status, code: Status.UNAVAILABLE, details: 'reply lost in transit' } : status);
          },
        });
      },
    });
  };
}

test('every RPC through the typed client, with the session header and typed errors', async (t) => {
  const daemon = new Daemon();
  await daemon.start();
  t.after(() => daemon.stop());
  const recorder = new Recorder();
  const broker = new Broker(daemon.address, { interceptors: [recorder.interceptor] });
  t.after(() => broker.close());

  // Sessions.
  const created = await broker.createSession({ sessionId: 'ts', config: { windowTokens: 400 } });
  assert.equal(created.session?.totals?.budgetTokens, 340);
  assert.equal((await broker.getSession('ts')).session?.sessionId, 'ts');
  const updated = await broker.updateSession({ sessionId: 'ts', config: { relevanceFloor: 0.1 } });
  assert.equal(updated.session?.config?.relevanceFloor, 0.1);

  // Admissions up to a compaction that keeps the constraint.
  const first = await broker.admit('ts', [user(CONSTRAINT)]);
  assert.equal(first.spans[0].spanClass, pb.SpanClass.SPAN_CLASS_CONSTRAINT);
  let compaction: pb.CompactionMarker | undefined;
  for (let i = 1; !compaction; i++) {
    compaction = (await broker.admit('ts', [tool(toolOutput(i))])).compaction;
  }
  assert.equal(compaction.outcome, pb.CompactionOutcome.COMPACTION_OUTCOME_COMMITTED);
  const context = await broker.getContext('ts');
  assert.ok(context.spans.some((s) => s.text === CONSTRAINT), 'the constraint survives');
  assert.ok((context.totals?.liveTokens ?? 1e9) <= 340);

  // Spans: one, listed, searched.
  const span = await broker.getSpan('ts', first.spans[0].spanId);
  assert.equal(span.span?.text, CONSTRAINT);
  const listed = await broker.listSpans({ sessionId: 'ts' });
  assert.ok(listed.spans.length >= context.spans.length);
  const found = await broker.searchSpans({ sessionId: 'ts', query: 'rollout' });
  assert.ok(found.hits.length > 0);

  // The pipelined stream.
  const stream = broker.admitStream('ts');
  const ids = [stream.send([tool(toolOutput(100))]), stream.send([tool(toolOutput(101))])];
  stream.end();
  const admitted: number[] = [];
  for await (const event of stream) {
    if (event.admitted) admitted.push(event.requestId);
  }
  assert.deepEqual(admitted, ids);

  // Pins.
  const note = await broker.admit('ts', [user('Reports go to the #deploys channel.', { spanClass: pb.SpanClass.SPAN_CLASS_NARRATIVE })]);
  const noteId = note.spans[0].spanId;
  const pinned = await broker.pin({ sessionId: 'ts', spanId: noteId });
  assert.equal(pinned.span?.spanClass, pb.SpanClass.SPAN_CLASS_CONSTRAINT);
  const unpinned = await broker.unpin({ sessionId: 'ts', spanId: noteId, actor: 'ops', reason: 'test' });
  assert.notEqual(unpinned.span?.spanClass, pb.SpanClass.SPAN_CLASS_CONSTRAINT);
  assert.equal(unpinned.marker?.actor, 'ops');

  // Server-wide calls.
  const info = await broker.getServerInfo();
  assert.equal(info.contractDigest.length, 64);
  const trigger = await broker.selectTrigger({
    workload: { windowTokens: 200_000, alpha: 0.85, cadenceMs: 90_000, maxSingleInjectionTokens: 120_000, maxIntervalAccumulationTokens: 120_000, idleGaps: true },
  });
  assert.equal(trigger.timeBasedSound, false);
  const sessions = [];
  for await (const s of broker.allSessions(1)) sessions.push(s.sessionId);
  assert.deepEqual(sessions, ['ts']);

  // Export, delete, import: the same context.
  const before = await broker.getContext('ts');
  const exported = await broker.exportSession('ts');
  assert.ok(exported.snapshot);
  assert.ok((await broker.deleteSession('ts')).spansDeleted > 0);
  const gone = await broker.getContext('ts').catch((e: unknown) => e);
  assert.ok(gone instanceof BrokerError);
  assert.equal(gone.code, Status.NOT_FOUND);
  assert.equal(gone.reason, 'SESSION_NOT_FOUND');
  await broker.importSession(exported.snapshot);
  const restored = await broker.getContext('ts');
  assert.deepEqual(restored.spans.map((s) => [s.spanId, s.text]), before.spans.map((s) => [s.spanId, s.text]));
  assert.ok(restored.spans.some((s) => s.text === CONSTRAINT));

  // Tool exchanges and their attributes; taking the newest span back;
  // a reset that keeps the configuration.
  const tooled = await broker.admit('ts', [
    { role: pb.Role.ROLE_ASSISTANT, text: 'kubectl get pods', toolCallId: 'call_1', toolName: 'kubectl', metadata: { 'app.id': 'm1' } },
    { role: pb.Role.ROLE_TOOL, text: 'web-1 Running', toolCallId: 'call_1', toolName: 'kubectl' },
  ]);
  assert.equal(tooled.spans[0].toolCallId, 'call_1');
  assert.deepEqual(tooled.spans[0].metadata, { 'app.id': 'm1' });
  const taken = await broker.retractLastTurn({ sessionId: 'ts', spans: 1 });
  assert.deepEqual(taken.spans.map((s) => s.spanId), [tooled.spans[1].spanId]);
  const notRetractable = await broker.retractLastTurn({ sessionId: 'ts', spans: 10_000 }).catch((e: unknown) => e);
  assert.ok(notRetractable instanceof BrokerError);
  const reset = await broker.resetSession({ sessionId: 'ts' });
  assert.equal(reset.session?.totals?.liveSpans, 0);
  assert.equal(reset.session?.config?.windowTokens, 400);
  assert.equal((await broker.getContext('ts')).spans.length, 0);

  // A bad request: INVALID_ARGUMENT naming the field.
  const bad = await broker.getContext('').catch((e: unknown) => e);
  assert.ok(bad instanceof BrokerError);
  assert.equal(bad.code, Status.INVALID_ARGUMENT);
  assert.equal(bad.codeName, 'INVALID_ARGUMENT');
  assert.equal(bad.fieldViolations[0]?.field, 'session_id');

  // Every call about one session carried its id; the others none.
  const unscoped = new Set(['GetServerInfo', 'SelectTrigger', 'ListSessions']);
  assert.ok(recorder.headers.length > 20);
  for (const [method, header] of recorder.headers) {
    if (unscoped.has(method)) assert.equal(header, undefined, method);
    else if (method === 'GetContext' && header === undefined) continue; // the empty id above
    else assert.equal(header, 'ts', method);
  }
  const seen = new Set(recorder.headers.map(([m]) => m));
  for (const method of Object.values(pb.ContextBrokerService).map((d) => d.path.split('/').pop())) {
    if (method !== 'WatchCompactions' && method !== 'PlanCompaction' && method !== 'CommitCompaction') {
      assert.ok(seen.has(method ?? ''), `${method} was called`);
    }
  }
});

test('an approval: the typed error carries the ready plan, and commit admits again', async (t) => {
  const daemon = new Daemon();
  await daemon.start();
  t.after(() => daemon.stop());
  const broker = new Broker(daemon.address);
  t.after(() => broker.close());
  await broker.createSession({ sessionId: 'gate', config: { windowTokens: 1200, mode: pb.SessionMode.SESSION_MODE_APPROVAL } });
  let refused: BrokerError | undefined;
  let turn = '';
  for (let i = 1; !refused; i++) {
    turn = toolOutput(i);
    refused = await broker.admit('gate', [tool(turn)]).then(() => undefined, (e: BrokerError) => e);
  }
  assert.equal(refused.code, Status.FAILED_PRECONDITION);
  assert.equal(refused.reason, 'APPROVAL_REQUIRED');
  const incoming = Number(refused.info.incoming_tokens);
  const planned = await broker.planCompaction({ sessionId: 'gate', incomingTokens: incoming });
  assert.equal(planned.verification?.passed, true);
  const committed = await broker.commitCompaction({ sessionId: 'gate', planId: planned.plan?.planId, actor: 'reviewer' });
  assert.equal(committed.marker?.actor, 'reviewer');
  const again = await broker.admit('gate', [tool(turn)]);
  assert.equal(again.spans.length, 1);
});

test('a lost Admit reply is retried with the same keys and admitted once', async (t) => {
  const daemon = new Daemon();
  await daemon.start();
  t.after(() => daemon.stop());
  const recorder = new Recorder();
  const broker = new Broker(daemon.address, { interceptors: [recorder.interceptor] });
  t.after(() => broker.close());
  await broker.createSession({ sessionId: 'retry', config: { windowTokens: 4000 } });

  recorder.dropNextAdmit = true;
  const reply = await broker.admit('retry', [user('Deploy only from the release branch.')]);
  assert.equal(reply.replayed, true, 'the second attempt found the first one admitted');
  const admits = recorder.headers.filter(([m]) => m === 'Admit');
  assert.equal(admits.length, 2);
  const context = await broker.getContext('retry');
  assert.equal(context.spans.length, 1, 'admitted once');
  assert.equal(context.turn, 1);

  // Without retries the lost reply is the caller's error.
  recorder.dropNextAdmit = true;
  const lost = await broker
    .admit('retry', [user('Tag every image with its commit.')], { retry: { attempts: 1, initialBackoffMs: 1, maxBackoffMs: 1 } })
    .catch((e: unknown) => e);
  assert.ok(lost instanceof BrokerError);
  assert.equal(lost.code, Status.UNAVAILABLE);
});

test('the watcher resumes after a kill -9 without a gap or a repeat', async (t) => {
  const daemon = new Daemon();
  await daemon.start();
  t.after(() => daemon.stop());
  const broker = new Broker(daemon.address);
  t.after(() => broker.close());
  await broker.createSession({ sessionId: 'w', config: { windowTokens: 400 } });
  const seqs: number[] = [];
  const watcher = (async () => {
    for await (const marker of broker.watchMarkers({ fromSeq: 1 })) {
      seqs.push(marker.seq);
      if (seqs.length === 4) return;
    }
  })();
  let i = 0;
  const compactTwice = async (): Promise<void> => {
    for (let n = 0; n < 2; ) {
      i += 1;
      if ((await broker.admit('w', [tool(toolOutput(i))])).compaction) n += 1;
    }
  };
  await compactTwice();
  await daemon.restartKill();
  await compactTwice();
  await watcher;
  assert.deepEqual(seqs, [1, 2, 3, 4]);
});
