import assert from 'node:assert/strict';
import { test } from 'node:test';
import { columnCapacity } from '../../../lib/model/stepwise.ts';

test('columnCapacity: room for the next column, spare columns within an eighth (≥ 16), multiples of 16', () => {
  for (let S = 0; S <= 4096; S++) {
    const cap = columnCapacity(S);
    assert.ok(cap > S, `S ${S}: capacity ${cap}`);
    assert.equal(cap % 16, 0);
    assert.ok(cap - S - 1 >= Math.max(16, Math.ceil(S / 8)), `S ${S}: spare ${cap - S - 1}`);
    assert.ok(cap - S - 1 < Math.max(16, Math.ceil(S / 8)) + 16, `S ${S}: spare ${cap - S - 1}`);
  }
  assert.equal(columnCapacity(256), 304);
});
