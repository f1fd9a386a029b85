// The package as it would be published: `npm pack --dry-run` lists the
// built client with its types, the contract it was built from and the
// watcher, and nothing else (no sources, tests, generator config or
// node_modules).
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');
const { execFileSync } = require('node:child_process');

const ROOT = path.join(__dirname, '..');

test('npm pack ships the built client, its types, the contract and the watcher only', () => {
  const out = execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: ROOT, encoding: 'utf8' });
  const [pack] = JSON.parse(out);
  const files = pack.files.map((f) => f.path).sort();
  for (const needed of ['package.json', 'watch.js', 'dist/index.js', 'dist/index.d.ts', 'dist/errors.d.ts', 'dist/gen/ctxbroker/v1/broker.js', 'proto/ctxbroker/v1/broker.proto']) {
    assert.ok(files.includes(needed), `${needed} is in the package: ${files.join(', ')}`);
  }
  const allowed = /^(package\.json|README\.md|watch\.js|dist\/.+\.(js|d\.ts|js\.map)|proto\/.+\.proto)$/;
  const unexpected = files.filter((f) => !allowed.test(f) || f.startsWith('dist-test/'));
  assert.deepEqual(unexpected, [], 'nothing else ships');
  const manifest = require('../package.json');
  assert.equal(manifest.types, 'dist/index.d.ts');
  assert.equal(require.resolve('..'), path.join(ROOT, 'dist', 'index.js'));
});
