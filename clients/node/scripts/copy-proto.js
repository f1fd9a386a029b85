// Copies the contract (the repository's proto/ directory) into the package,
// so a published package carries the .proto files its code was built from
// (watch.js loads them at run time outside a checkout).
'use strict';

const fs = require('node:fs');
const path = require('node:path');

const source = process.env.CTXBROKER_PROTO_DIR || path.join(__dirname, '..', '..', '..', 'proto');
const target = path.join(__dirname, '..', 'proto');
if (!fs.existsSync(path.join(source, 'ctxbroker', 'v1', 'broker.proto'))) {
  console.error(`copy-proto: no ctxbroker/v1/broker.proto under ${source}; set CTXBROKER_PROTO_DIR`);
  process.exit(1);
}
fs.rmSync(target, { recursive: true, force: true });
fs.cpSync(source, target, { recursive: true, filter: (p) => fs.statSync(p).isDirectory() || p.endsWith('.proto') });
