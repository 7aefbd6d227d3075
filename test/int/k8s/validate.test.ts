/**
 * Every overlay under infra/k8s renders with `kubectl kustomize` and every object in it is valid
 * against the Kubernetes OpenAPI schemas (kubernetes-models), unknown fields included; the KEDA
 * component's ScaledObjects against the schema in test/support/keda-schema.ts. And the validation
 * itself can fail: an unknown field, a wrong type and an unknown kind are each reported.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Deployment } from 'kubernetes-models/apps/v1/Deployment';
import { join } from 'node:path';
import {
  K8S,
  OVERLAYS,
  render,
  renderOverlay,
  renderWithComponents,
  validateObjects,
  describeObject,
  type K8sObject,
} from '../../support/k8s-manifests.ts';

const clone = <T>(x: T): T => structuredClone(x);

for (const overlay of OVERLAYS) {
  test(`overlays/${overlay} renders and every object is schema-valid, with no unknown field`, () => {
    const objs = renderOverlay(overlay);
    assert.ok(objs.length > 10, `rendered ${objs.length} objects`);
    assert.deepEqual(validateObjects(objs), []);
  });
}

test('the KEDA component composes with an overlay and its ScaledObjects are valid', () => {
  const objs = renderWithComponents('infra/k8s/overlays/prod', ['infra/k8s/components/keda']);
  const scaled = objs.filter((o) => o.kind === 'ScaledObject');
  assert.deepEqual(scaled.map(describeObject).sort(), ['ScaledObject/reward', 'ScaledObject/rollout']);
  assert.deepEqual(validateObjects(objs), []);
});

function devDeployment(): K8sObject {
  const d = renderOverlay('dev').find((o) => o.kind === 'Deployment' && o.metadata.name === 'update');
  assert.ok(d, 'the dev overlay has the update Deployment');
  return d!;
}

test('an unknown field is rejected at any depth (the stock validator alone would let it through)', () => {
  const good = devDeployment();
  const typo = clone(good) as any;
  typo.spec.template.spec.containers[0].imagePullPolicyy = 'Always';
  // kubernetes-models' own validator does not reject unknown fields (the OpenAPI schemas do not
  // forbid additional properties): that is why validateObjects has a second, strict pass
  assert.doesNotThrow(() => new Deployment(typo).validate());
  const p1 = validateObjects([typo]);
  assert.equal(p1.length, 1, p1.join('\n'));
  assert.match(p1[0], /^Deployment\/update: .*'imagePullPolicyy' does not exist/);

  const misplaced = clone(good) as any;
  misplaced.spec.template.spec.readOnlyRootFilesystem = true; // belongs in a container's securityContext
  assert.match(validateObjects([misplaced]).join('\n'), /'readOnlyRootFilesystem' does not exist/);

  const top = clone(good) as any;
  top.spec.replica = 2;
  assert.match(validateObjects([top]).join('\n'), /'replica' does not exist/);
});

test('a wrong type, a missing required field and an unknown kind are rejected', () => {
  const good = devDeployment();
  const wrongType = clone(good) as any;
  wrongType.spec.replicas = 'two';
  assert.match(validateObjects([wrongType]).join('\n'), /Deployment\/update: .*replicas.*(integer|number)/);

  const noSelector = clone(good) as any;
  delete noSelector.spec.selector;
  assert.match(validateObjects([noSelector]).join('\n'), /selector/);

  const crd: K8sObject = { apiVersion: 'example.com/v1', kind: 'Widget', metadata: { name: 'w' } };
  assert.match(validateObjects([crd]).join('\n'), /Widget\/w: no schema for example\.com\/v1 Widget/);
});

test('a ScaledObject with an unknown or mistyped field is rejected', () => {
  const so = renderWithComponents('infra/k8s/overlays/prod', ['infra/k8s/components/keda']).find(
    (o) => o.kind === 'ScaledObject',
  )!;
  const extra = clone(so) as any;
  extra.spec.maxReplicas = 4;
  assert.match(validateObjects([extra]).join('\n'), /ScaledObject\/(rollout|reward): .*maxReplicas/);
  const badTrigger = clone(so) as any;
  badTrigger.spec.triggers[0].metadata.lagTreshold = '4';
  assert.match(validateObjects([badTrigger]).join('\n'), /triggers\.0\.metadata.*lagTreshold/);
  const numberLag = clone(so) as any;
  numberLag.spec.triggers[0].metadata.lagThreshold = 4;
  assert.match(validateObjects([numberLag]).join('\n'), /lagThreshold/);
});

test('without kubectl the tests fail saying how to install it (they never skip)', () => {
  assert.throws(
    () => render(join(K8S, 'overlays/dev'), '/nonexistent/kubectl'),
    /kubectl is not installed: .*apt-get install kubectl/,
  );
});
