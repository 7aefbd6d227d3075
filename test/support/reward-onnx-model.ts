/**
 * Tiny ONNX sequence scorers for the reward tests, built with onnx-proto (no Python):
 *
 *   score[b] = Σ_t emb[input_ids[b,t]] · mask[b,t] / Σ_t mask[b,t]      ("mean" model, output [B])
 *   value[b,t] = emb[input_ids[b,t]] · mask[b,t]                       ("per_token" model, output [B, T])
 *
 * over a fixed 256-entry embedding, so tests can compute the expected score in JS
 * (`referenceMeanScore`). Opset 13: ReduceSum takes its axes as an input.
 */
import { writeFileSync } from 'node:fs';
import onnxProto from 'onnx-proto';

const { onnx } = onnxProto;

const FLOAT = 1,
  INT64 = 7;

/** The embedding table: a deterministic value in [-2, 2] per byte id. */
export function embeddingTable(): Float32Array {
  return Float32Array.from({ length: 256 }, (_, i) => (((i * 37) % 17) - 8) / 4);
}

/** What the "mean" model computes for one token sequence (float32 rounding aside). */
export function referenceMeanScore(ids: number[]): number {
  const emb = embeddingTable();
  return ids.reduce((s, id) => s + emb[id], 0) / ids.length;
}

function valueInfo(name: string, elemType: number, dims: (string | number)[]) {
  return onnx.ValueInfoProto.create({
    name,
    type: {
      tensorType: {
        elemType,
        shape: { dim: dims.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) },
      },
    },
  });
}

function tensor(name: string, dataType: number, dims: number[], raw: Uint8Array) {
  return onnx.TensorProto.create({ name, dataType, dims, rawData: raw });
}

/**
 * Builds the model bytes; `kind` picks the output ([B] mean score or [B, T] per-token values);
 * `idsName` renames the token input (to test the input-contract check).
 */
export function buildScorerModel(kind: 'mean' | 'per_token' = 'mean', idsName = 'input_ids'): Uint8Array {
  const emb = embeddingTable();
  const nodes = [
    onnx.NodeProto.create({
      opType: 'Gather',
      input: ['emb', idsName],
      output: ['e'],
      attribute: [{ name: 'axis', type: onnx.AttributeProto.AttributeType.INT, i: 0 }],
    }),
    onnx.NodeProto.create({
      opType: 'Cast',
      input: ['attention_mask'],
      output: ['m'],
      attribute: [{ name: 'to', type: onnx.AttributeProto.AttributeType.INT, i: FLOAT }],
    }),
    onnx.NodeProto.create({ opType: 'Mul', input: ['e', 'm'], output: kind === 'per_token' ? ['value'] : ['em'] }),
  ];
  const initializer = [tensor('emb', FLOAT, [256], new Uint8Array(emb.buffer.slice(0)))];
  if (kind === 'mean') {
    initializer.push(tensor('axes', INT64, [1], new Uint8Array(BigInt64Array.from([1n]).buffer)));
    nodes.push(
      onnx.NodeProto.create({
        opType: 'ReduceSum',
        input: ['em', 'axes'],
        output: ['s'],
        attribute: [{ name: 'keepdims', type: onnx.AttributeProto.AttributeType.INT, i: 0 }],
      }),
      onnx.NodeProto.create({
        opType: 'ReduceSum',
        input: ['m', 'axes'],
        output: ['n'],
        attribute: [{ name: 'keepdims', type: onnx.AttributeProto.AttributeType.INT, i: 0 }],
      }),
      onnx.NodeProto.create({ opType: 'Div', input: ['s', 'n'], output: ['score'] }),
    );
  }
  const graph = onnx.GraphProto.create({
    name: `reward_${kind}`,
    node: nodes,
    initializer,
    input: [valueInfo(idsName, INT64, ['B', 'T']), valueInfo('attention_mask', INT64, ['B', 'T'])],
    output: [kind === 'per_token' ? valueInfo('value', FLOAT, ['B', 'T']) : valueInfo('score', FLOAT, ['B'])],
  });
  const model = onnx.ModelProto.create({
    irVersion: 8,
    producerName: 'rlstream-test',
    opsetImport: [{ domain: '', version: 13 }],
    graph,
  });
  return onnx.ModelProto.encode(model).finish();
}

export function writeScorerModel(path: string, kind: 'mean' | 'per_token' = 'mean', idsName = 'input_ids'): string {
  writeFileSync(path, buildScorerModel(kind, idsName));
  return path;
}
