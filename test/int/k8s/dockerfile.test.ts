/**
 * The image's contents, checked without a container engine: the Dockerfile's final stage and
 * .dockerignore are parsed, the files they put into /app are copied into a scratch directory
 * (with the checkout's node_modules beside them), and a short embedded training run from there
 * proves the CLI, its sources, schemas, migrations and the example it trains are all in the image.
 * Statically: every package the runtime imports is a production dependency (the image runs
 * `npm ci --omit=dev`), the base image is pinned, the user is the non-root uid the manifests name,
 * and the final stage has no npm.
 */
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { cpSync, existsSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync, symlinkSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { spawnSync } from 'node:child_process';
import { builtinModules } from 'node:module';
import { ROOT } from '../../support/k8s-manifests.ts';

const dockerfile = readFileSync(join(ROOT, 'Dockerfile'), 'utf8');
const finalStage = dockerfile.slice(dockerfile.lastIndexOf('\nFROM '));
const copies = [...finalStage.matchAll(/^COPY (?!--from)(.+) (\S+)$/gm)].flatMap((m) => m[1]!.split(/\s+/));
const allowed = readFileSync(join(ROOT, '.dockerignore'), 'utf8')
  .split('\n')
  .filter((l) => l.startsWith('!'))
  .map((l) => l.slice(1).replace(/\/\*\*$/, ''));
const scratch = join(ROOT, 'test/.tmp', `image-${process.pid}`);
after(() => rmSync(scratch, { recursive: true, force: true }));

test('Dockerfile: pinned base, npm ci --omit=dev with allowScripts, non-root uid 10001, no npm in the final image, rlstream entrypoint', () => {
  assert.match(dockerfile, /^ARG NODE_IMAGE=node:20\.\d+\.\d+-\w+-slim$/m, 'base pinned to an exact node:20 slim tag');
  assert.match(dockerfile, /COPY package\.json package-lock\.json \.npmrc \.\/\nRUN npm ci --omit=dev/);
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
    allowScripts?: Record<string, boolean>;
  };
  assert.equal(pkg.allowScripts?.['onnxruntime-node'], false, "allowScripts denies onnxruntime-node's CUDA download");
  assert.doesNotMatch(readFileSync(join(ROOT, '.npmrc'), 'utf8'), /onnxruntime-node-install/, 'npm 11 warns on it');
  assert.match(finalStage, /^USER 10001:10001$/m);
  assert.match(finalStage, /rm -rf \/usr\/local\/lib\/node_modules\/npm/);
  assert.match(finalStage, /^ENTRYPOINT \["rlstream"\]$/m);
  for (const c of copies)
    assert.ok(allowed.includes(c), `COPY ${c} is in .dockerignore's allowlist (else the build context lacks it)`);
});

/** Bare package names imported by the TypeScript/JS files under `dirs` (static and literal dynamic imports). */
function importedPackages(dirs: string[]): Map<string, string> {
  const found = new Map<string, string>();
  const walk = (d: string): void => {
    for (const n of readdirSync(d)) {
      const p = join(d, n);
      if (statSync(p).isDirectory()) {
        walk(p);
        continue;
      }
      if (!/\.(ts|mjs|js)$/.test(n)) continue;
      const src = readFileSync(p, 'utf8');
      for (const m of src.matchAll(
        /(?:^|\n)\s*(?:import|export)\s[^'";]*?from\s+'([^']+)'|import\(\s*'([^']+)'\s*\)|^import\s+'([^']+)'/gm,
      )) {
        const spec = m[1] ?? m[2] ?? m[3]!;
        if (spec.startsWith('.') || spec.startsWith('node:') || builtinModules.includes(spec)) continue;
        const name = spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0]!;
        if (!found.has(name)) found.set(name, relative(ROOT, p));
      }
    }
  };
  for (const d of dirs) walk(join(ROOT, d));
  return found;
}

test("every package the image's code imports is a production dependency", () => {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { dependencies: Record<string, string> };
  const dirs = copies.filter(
    (c) => existsSync(join(ROOT, c)) && statSync(join(ROOT, c)).isDirectory() && c !== 'examples',
  );
  assert.ok(dirs.includes('lib') && dirs.includes('services') && dirs.includes('bin'));
  const missing = [...importedPackages(dirs)]
    .filter(([name]) => !(name in pkg.dependencies))
    .map(([n, f]) => `${n} (imported by ${f})`);
  assert.deepEqual(missing, [], 'imported at run time but not in dependencies (npm ci --omit=dev leaves it out)');
});

test(
  "the image's files alone run the CLI: an embedded number-game run from a copy of exactly what the Dockerfile copies",
  { timeout: 240_000 },
  () => {
    mkdirSync(scratch, { recursive: true });
    for (const c of copies) {
      const from = join(ROOT, c);
      assert.ok(existsSync(from), `${c} exists`);
      cpSync(from, join(scratch, c), {
        recursive: true,
        filter: (src) => !/(^|\/)(runs|\.rlstream)(\/|$)|\.log$/.test(relative(ROOT, src)),
      });
    }
    symlinkSync(join(ROOT, 'node_modules'), join(scratch, 'node_modules'));
    const cli = ['bin/rlstream.mjs'];
    const help = spawnSync(process.execPath, [...cli, '--help'], { cwd: scratch, encoding: 'utf8' });
    assert.equal(help.status, 0, help.stderr);
    assert.match(help.stdout, /serve/);
    const runDir = join(scratch, 'run');
    const r = spawnSync(
      process.execPath,
      [
        ...cli,
        'train',
        'examples/number-game.yaml',
        `trainer.run_dir=${runDir}`,
        'trainer.max_steps=2',
        'trainer.val_before_train=false',
        'trainer.val_freq=-1',
        'trainer.save_freq=-1',
      ],
      { cwd: scratch, encoding: 'utf8', timeout: 200_000, env: { ...process.env, RLSTREAM_LOG_LEVEL: 'warn' } },
    );
    assert.equal(r.status, 0, `train from the image's files failed:\n${r.stderr.slice(-3000)}`);
    assert.ok(existsSync(join(runDir, 'db')), 'the run opened its embedded database (migrations from the image)');
    assert.equal(resolve(dirname(join(scratch, cli[0]!)), '..'), scratch);
  },
);
