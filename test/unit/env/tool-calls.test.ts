/**
 * Tool-call parsing by format (lib/env/tool-calls.ts): hermes blocks and Llama 3 JSON, well-formed
 * and malformed calls, the registry's unknown-name line, and the writer as the parser's inverse.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { TOOL_CALL_FORMATS, formatToolCall, toolCallParser } from '../../../lib/env/tool-calls.ts';

const hermes = toolCallParser('hermes');
const llama = toolCallParser('llama3_json');

test('hermes: every <tool_call> block, with text around them; arguments as an object or a JSON string', () => {
  const r = hermes(
    'Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "12*7"}}\n</tool_call>\n' +
      '<tool_call>{"name":"now","arguments":"{}"}</tool_call> done',
  );
  assert.deepEqual(r.calls, [
    { name: 'calc', arguments: { expression: '12*7' } },
    { name: 'now', arguments: {} },
  ]);
  assert.deepEqual(r.malformed, []);
  assert.deepEqual(hermes('The answer is 84.'), { calls: [], malformed: [] });
  // no arguments key: an empty object
  assert.deepEqual(hermes('<tool_call>{"name": "now"}</tool_call>').calls, [{ name: 'now', arguments: {} }]);
});

test('hermes: malformed calls are reported with the reason, well-formed ones next to them still parse', () => {
  const cases: Array<[string, RegExp]> = [
    ['<tool_call>{"name": "calc", "arguments": {"expression": "1+1"}</tool_call>', /not JSON/],
    ['<tool_call>[1, 2]</tool_call>', /not a JSON object/],
    ['<tool_call>{"arguments": {}}</tool_call>', /no "name" string/],
    ['<tool_call>{"name": "calc", "arguments": [1]}</tool_call>', /"arguments" is not a JSON object/],
    ['<tool_call>{"name": "calc", "arguments": "x=1"}</tool_call>', /"arguments" is a string that is not JSON/],
    ['<tool_call>{"name": "calc", "arguments": {}}', /<tool_call> without <\/tool_call>/],
  ];
  for (const [text, reason] of cases) {
    const r = hermes(text);
    assert.equal(r.calls.length, 0, text);
    assert.equal(r.malformed.length, 1, text);
    assert.match(r.malformed[0].reason, reason, text);
  }
  const mixed = hermes(
    '<tool_call>{oops}</tool_call><tool_call>{"name": "calc", "arguments": {"expression": "2"}}</tool_call>',
  );
  assert.deepEqual(mixed.calls, [{ name: 'calc', arguments: { expression: '2' } }]);
  assert.equal(mixed.malformed[0].text, '{oops}');
});

test('llama3_json: the message as {"name", "parameters"}, after <|python_tag|>, several separated by ";"', () => {
  assert.deepEqual(llama('{"name": "calc", "parameters": {"expression": "3*4"}}').calls, [
    { name: 'calc', arguments: { expression: '3*4' } },
  ]);
  assert.deepEqual(llama('<|python_tag|>{"name": "now", "parameters": {}}').calls, [{ name: 'now', arguments: {} }]);
  const two = llama('{"name": "calc", "parameters": {"expression": "a;b"}}; {"name": "now", "parameters": {}}');
  assert.deepEqual(
    two.calls.map((c) => c.name),
    ['calc', 'now'],
  );
  assert.equal(two.calls[0].arguments.expression, 'a;b');
  assert.deepEqual(llama('The answer is 12.'), { calls: [], malformed: [] });
  const bad = llama('{"name": "calc", "parameters": {"expression": ');
  assert.equal(bad.calls.length, 0);
  assert.match(bad.malformed[0].reason, /not JSON/);
  assert.match(llama('{"parameters": {}}').malformed[0].reason, /no "name" string/);
});

test('the writer is the parser inverse for every format; an unknown format lists the valid ones', () => {
  const call = { name: 'calc', arguments: { expression: '691*453', note: 'a "quoted" </tool_call>?' } };
  for (const f of TOOL_CALL_FORMATS) assert.deepEqual(toolCallParser(f)(formatToolCall(f, call)).calls, [call], f);
  assert.throws(
    () => toolCallParser('pythonic'),
    /unknown rollout\.multi_turn\.format "pythonic" \(valid tool-call formats: hermes, llama3_json\)/,
  );
});
