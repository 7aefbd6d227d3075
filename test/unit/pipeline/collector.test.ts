import { test } from 'node:test';
import assert from 'node:assert/strict';
import { StepCollector } from '../../../lib/pipeline/collector.ts';

test('step collector orders by id, drops duplicates and reports low watermarks', () => {
  const c = new StepCollector<number>();
  assert.equal(c.add('s1', 'b', 2, { topic: 't', partition: 0, offset: 7 }), true);
  assert.equal(c.add('s1', 'a', 1, { topic: 't', partition: 0, offset: 9 }), true);
  assert.equal(c.add('s1', 'a', 1, { topic: 't', partition: 0, offset: 12 }), false);
  c.add('s2', 'c', 3, { topic: 't', partition: 1, offset: 4 });
  assert.deepEqual(
    c.groups('s1').map((g) => g.id),
    ['a', 'b'],
  );
  assert.deepEqual(
    [...c.lowWatermarks()],
    [
      ['t:0', 7],
      ['t:1', 4],
    ],
  );
  c.take('s1');
  assert.deepEqual([...c.lowWatermarks()], [['t:1', 4]]);
});
