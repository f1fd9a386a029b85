// Runs a real ctxbrokerd for the tests: a fresh temporary data directory,
// `--listen 127.0.0.1:0` with the bound address read from the daemon's own
// `serving` log line, readiness by the first answered GetServerInfo, and restarts on
// the same data directory and the same port (the daemon binds with
// SO_REUSEADDR, so the port is free again as soon as the process is gone).
'use strict';

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const readline = require('node:readline');
const { spawn } = require('node:child_process');
const grpc = require('@grpc/grpc-js');
const { connect } = require('../watch.js');

const REPO = path.join(__dirname, '..', '..', '..');

/** $CTXBROKERD, else the repository's debug (then release) build. */
function binary() {
  if (process.env.CTXBROKERD) return process.env.CTXBROKERD;
  for (const profile of ['debug', 'release']) {
    const candidate = path.join(REPO, 'target', profile, 'ctxbrokerd');
    if (fs.existsSync(candidate)) return candidate;
  }
  throw new Error('no ctxbrokerd binary: set CTXBROKERD or run `cargo build --bin ctxbrokerd`');
}

class Daemon {
  constructor(args = []) {
    this.temp = fs.mkdtempSync(path.join(os.tmpdir(), 'ctxbroker-node-'));
    this.dataDir = path.join(this.temp, 'data');
    this.logPath = path.join(this.temp, 'ctxbrokerd.log');
    this.args = args;
    this.address = null;
    this.child = null;
  }

  /** Starts the daemon (on the same port as before, after the first start)
   * and resolves once it answers. */
  async start() {
    const listen = this.address || '127.0.0.1:0';
    const log = fs.openSync(this.logPath, 'a');
    const child = spawn(
      binary(),
      ['--listen', listen, '--data-dir', this.dataDir, '--log-format', 'json', '--shutdown-grace-ms', '3000', ...this.args],
      { stdio: ['ignore', log, 'pipe'], env: { ...process.env, CTXBROKER_LOG: 'info' } },
    );
    fs.closeSync(log);
    this.child = child;
    const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
    this.exited = exited;
    const lines = readline.createInterface({ input: child.stderr });
    const serving = new Promise((resolve) => {
      lines.on('line', (line) => {
        fs.appendFileSync(this.logPath, `${line}\n`);
        let entry;
        try {
          entry = JSON.parse(line);
        } catch {
          return;
        }
        if (entry.fields && entry.fields.message === 'serving') resolve(entry.fields.local);
      });
    });
    const first = await Promise.race([serving, exited.then((how) => ({ how }))]);
    if (typeof first !== 'string') {
      throw new Error(`ctxbrokerd exited during start (${JSON.stringify(first.how)}):\n${this.logTail()}`);
    }
    this.address = first;
    await this.waitServing(60_000);
  }

  /** Resolves once the daemon answers GetServerInfo (within the deadline). */
  async waitServing(timeoutMs) {
    const client = connect(this.address);
    try {
      await unary(client, 'GetServerInfo', {}, timeoutMs);
    } finally {
      client.close();
    }
  }

  async signal(sig) {
    if (!this.child || this.child.exitCode !== null || this.child.signalCode !== null) return null;
    this.child.kill(sig);
    return this.exited;
  }

  /** kill -9, then start again on the same data directory and port. */
  async restartKill() {
    await this.signal('SIGKILL');
    await this.start();
  }

  /** SIGTERM (orderly shutdown, exit code 0 expected), then start again. */
  async restartTerm() {
    const how = await this.signal('SIGTERM');
    if (how && how.code !== 0) throw new Error(`ctxbrokerd exited ${JSON.stringify(how)} on SIGTERM:\n${this.logTail()}`);
    await this.start();
  }

  async stop() {
    await this.signal('SIGTERM');
    fs.rmSync(this.temp, { recursive: true, force: true });
  }

  logTail(lines = 40) {
    try {
      return fs.readFileSync(this.logPath, 'utf8').split('\n').slice(-lines).join('\n');
    } catch {
      return '(no log)';
    }
  }
}

/** Calls a unary method and resolves with its reply. The call waits for
 * the daemon (within the deadline) when it is restarting. */
function unary(client, method, request, timeoutMs = 30_000) {
  return new Promise((resolve, reject) => {
    client[method](
      request,
      new grpc.Metadata({ waitForReady: true }),
      { deadline: Date.now() + timeoutMs },
      (err, reply) => (err ? reject(err) : resolve(reply)),
    );
  });
}

module.exports = { Daemon, unary };
