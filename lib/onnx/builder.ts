/**
 * A small typed ONNX graph builder with reverse-mode autodiff (opset 17, ORT ≥ 1.17).
 *
 * ## Model
 * - `const b = new GraphBuilder({ name, float: 'float32' | 'float64' })`. `b.float` is the float
 *   dtype every model function should use, so the same code builds a float64 graph for
 *   finite-difference checks.
 * - Values are `Var`s: `{ name, dtype, shape }`. Dims are numbers or symbolic strings (`'B'`, `'T'`,
 *   products `'B*T'`, sums `'P+T'`; see dims.ts) so one graph serves a whole shape family. Every op
 *   checks shapes at build time and throws `GraphError` naming the node and the shapes.
 * - Sources: `b.input(name, dtype, shape)`, `b.initializer(name, data, shape, dtype?)`,
 *   `b.const(number | number[], dtype?)` (cached scalar/vector constants). Symbolic dims of inputs
 *   (and of any op output that introduces a new atom) can be materialised at runtime
 *   (`b.dimTensor('T')`, `b.shapeTensor(shape)`) for Reshape/Expand/Slice.
 * - Outputs: `b.output(v, name?)` (renames via Identity when `name` differs). Build:
 *   `b.toModelProto()`, `b.toBytes()` (dead nodes pruned).
 * - Readable node names: `b.scope('layers.0/attn', () => ...)` prefixes every node/value name
 *   created inside; backward nodes are named `grad/<forward scope>/...`.
 *
 * ## Ops (all shape-checked; binary ops broadcast numpy-style and accept numbers as constants)
 * Differentiable: add sub mul div neg exp log sqrt reciprocal tanh sigmoid abs pow(x, p) square
 * max min clip(x, lo?, hi?) where(cond, a, b) matmul gemm(a, b, {transA, transB, alpha})
 * reshape transpose unsqueeze squeeze concat slice(x, axis, start, end?) split(x, axis, sizes)
 * gather(data, idx, 0) gatherElements expand reduceSum reduceMean softmax logSoftmax cast identity.
 * Not differentiable (no gradient flows through them): equal less lessOrEqual greater
 * greaterOrEqual and or not isNaN isInf sign reduceMax argMax shape range; `stopGradient(x)`.
 * Escape hatch (forward only): `b.op(type, inputs, attrs, outSpec | outSpec[], domain?)` where an
 * attr that is an integer number becomes INT (wrap in `floatAttr(x)` to force FLOAT), arrays of
 * integers INTS, strings STRING, typed-array tensors via `tensorAttr(...)`.
 *
 * Composite ops with fused backward rules live in nn.ts: `linear`, `rmsNorm`, `silu`, `swiglu`,
 * `rope`, `embedding` (one-hot Gemm gradient for small vocabularies), `tokenLogprobEntropy`.
 *
 * ## Autodiff
 * Each op records a tape entry `{inputs, outputs, vjp}` next to its forward rule. Composite ops
 * with a hand-written backward compute their forward under `b.stopGradient` and attach the rule
 * with `b.customVjp(inputs, outputs, vjp)`. `b.grad(y, wrt, dy?)` emits the backward graph into
 * the same builder and returns one gradient Var per `wrt` (zeros when `y` does not depend on it);
 * `dy` defaults to 1 for a scalar `y`. Gradients of broadcast operands are summed back to the
 * operand's shape. Every rule has a float64 finite-difference test (test/unit/onnx/).
 * `b.checkpoint(xs, fn)` (gradient checkpointing) keeps only `xs` for the backward and recomputes
 * `fn` there, tied to the incoming gradient so onnxruntime neither runs it early nor merges it back.
 *
 * ## Example
 * ```ts
 * const b = new GraphBuilder({ name: 'mlp', float: 'float32' });
 * const x = b.input('x', 'float32', ['B', 16]);
 * const w = b.input('w', 'float32', [8, 16]);
 * const y = b.scope('layer0', () => b.tanh(linear(b, x, w)));   // [B, 8], node 'layer0/tanh'
 * const loss = b.reduceMean(b.mul(y, y), [0, 1]);
 * const [gw] = b.grad(loss, [w]);
 * b.output(loss, 'loss'); b.output(gw, 'grad_w');
 * const session = await createSession(b.toBytes(), { threads: 2 });   // runtime.ts
 * ```
 */
import onnxProto from 'onnx-proto';
import {
  canonDim,
  dimAdd,
  dimEq,
  dimMul,
  fmtShape,
  isAtom,
  isKnown,
  numel,
  parseDim,
  shapeEq,
  type Dim,
  type DimExpr,
  type Shape,
} from './dims.ts';

export { type Dim, type Shape, dimEq, dimMul, dimAdd, dimDiv, numel, shapeEq, fmtShape } from './dims.ts';

const { onnx } = onnxProto;

export type DType = 'float32' | 'float64' | 'float16' | 'int64' | 'int32' | 'int8' | 'uint8' | 'bool';
export type FloatDType = 'float32' | 'float64';

const ONNX_DTYPE: Record<DType, number> = {
  float32: 1,
  uint8: 2,
  int8: 3,
  int32: 6,
  int64: 7,
  bool: 9,
  float16: 10,
  float64: 11,
};
const BYTES: Record<DType, number> = {
  float32: 4,
  uint8: 1,
  int8: 1,
  int32: 4,
  int64: 8,
  bool: 1,
  float16: 2,
  float64: 8,
};

export function isFloatType(d: DType): boolean {
  return d === 'float32' || d === 'float64' || d === 'float16';
}

export class GraphError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'GraphError';
  }
}

export type TensorData =
  Float32Array | Float64Array | BigInt64Array | Int32Array | Int8Array | Uint8Array | Uint16Array;

/** A value in the graph. */
export class Var {
  constructor(
    readonly builder: GraphBuilder,
    readonly id: number,
    readonly name: string,
    readonly dtype: DType,
    readonly shape: Shape,
  ) {}
  get rank(): number {
    return this.shape.length;
  }
  toString(): string {
    return `${this.name}: ${this.dtype}${fmtShape(this.shape)}`;
  }
}

export interface OutSpec {
  dtype: DType;
  shape: Shape;
}
export type Operand = Var | number;
/**
 * Given the output gradients (null = zero), return one gradient per input (null = none).
 * `wanted[i]` says whether input i's gradient is used (a rule may skip the others).
 */
export type Vjp = (gOut: (Var | null)[], wanted: boolean[]) => (Var | null)[];

class FloatAttr {
  constructor(readonly v: number | number[]) {}
}
class TensorAttr {
  constructor(
    readonly data: TensorData,
    readonly shape: number[],
    readonly dtype: DType,
  ) {}
}
/** Force a FLOAT/FLOATS attribute in `b.op` (plain integer numbers become INT). */
export function floatAttr(v: number | number[]): FloatAttr {
  return new FloatAttr(v);
}
export function tensorAttr(data: TensorData, shape: number[], dtype: DType): TensorAttr {
  return new TensorAttr(data, shape, dtype);
}
export type AttrValue = number | number[] | string | string[] | FloatAttr | TensorAttr;

interface NodeRec {
  opType: string;
  name: string;
  inputs: string[];
  outputs: string[];
  attrs: Record<string, AttrValue>;
  domain: string;
  /** The Identity that output() adds to name a graph output (folded into its producer when serialised). */
  outputAlias?: boolean;
}
interface TapeEntry {
  inputs: (Var | null)[];
  outputs: Var[];
  vjp: Vjp;
  scope: string;
}
interface InitRec {
  name: string;
  dtype: DType;
  shape: number[];
  data: TensorData;
}

export interface BuilderOptions {
  name?: string;
  /** The float dtype model code should use (`b.float`). Default float32. */
  float?: FloatDType;
  opset?: number;
}

function typedFor(dtype: DType, values: number[]): TensorData {
  switch (dtype) {
    case 'float32':
      return Float32Array.from(values);
    case 'float64':
      return Float64Array.from(values);
    case 'int64':
      return BigInt64Array.from(values.map((v) => BigInt(Math.trunc(v))));
    case 'int32':
      return Int32Array.from(values);
    case 'int8':
      return Int8Array.from(values);
    case 'uint8':
    case 'bool':
      return Uint8Array.from(values.map((v) => (dtype === 'bool' ? (v ? 1 : 0) : v)));
    default:
      throw new GraphError(`constants of dtype ${dtype} are not supported`);
  }
}

function normAxis(axis: number, rank: number, what: string): number {
  const a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) throw new GraphError(`${what}: axis ${axis} out of range for rank ${rank}`);
  return a;
}

export class GraphBuilder {
  readonly name: string;
  readonly float: FloatDType;
  readonly opset: number;
  private nextId = 0;
  private counters = new Map<string, number>();
  private scopes: string[] = [];
  private nodes: NodeRec[] = [];
  private inits: InitRec[] = [];
  private inputs: Var[] = [];
  private outputs: Var[] = [];
  private usedNames = new Set<string>();
  private tape: TapeEntry[] = [];
  private constCache = new Map<string, Var>();
  private dimSources = new Map<string, { v: Var; axis: number }>();
  private dimTensorCache = new Map<string, Var>();
  private namedDims = new Set<string>();
  private extraDomains = new Map<string, number>();
  /** The gradients the last checkpoint's backward returned (see `checkpoint`). */
  private ckptDone: Var[] = [];

  constructor(opts: BuilderOptions = {}) {
    this.name = opts.name ?? 'graph';
    this.float = opts.float ?? 'float32';
    this.opset = opts.opset ?? 17;
  }

  // ───────────────────────────── naming, scopes ─────────────────────────────

  /** Run `fn` with `name` appended to the node-name prefix. */
  scope<R>(name: string, fn: () => R): R {
    this.scopes.push(name);
    try {
      return fn();
    } finally {
      this.scopes.pop();
    }
  }

  get currentScope(): string {
    return this.scopes.join('/');
  }

  private uniqueName(base: string): string {
    const prefix = this.currentScope;
    const full = prefix ? `${prefix}/${base}` : base;
    const n = this.counters.get(full) ?? 0;
    this.counters.set(full, n + 1);
    let name = n === 0 ? full : `${full}_${n}`;
    while (this.usedNames.has(name)) name = `${name}_`;
    this.usedNames.add(name);
    return name;
  }

  private newVar(name: string, dtype: DType, shape: Shape): Var {
    const cshape = shape.map((d) => canonDim(d));
    for (const d of cshape) {
      if (typeof d === 'number' && (!Number.isInteger(d) || d < 0))
        throw new GraphError(`${name}: invalid dimension ${d} in ${fmtShape(shape)}`);
    }
    const v = new Var(this, this.nextId++, name, dtype, cshape);
    cshape.forEach((d, axis) => {
      if (isAtom(d) && !d.startsWith('?') && !this.dimSources.has(d)) this.dimSources.set(d, { v, axis });
    });
    return v;
  }

  /** A fresh unknown dim (not materialisable at runtime). */
  unknownDim(): string {
    return `?${this.nextId++}`;
  }

  // ───────────────────────────── sources and sinks ─────────────────────────────

  input(name: string, dtype: DType, shape: Shape): Var {
    if (this.usedNames.has(name)) throw new GraphError(`input "${name}" is already defined`);
    this.usedNames.add(name);
    const v = this.newVar(name, dtype, shape);
    this.inputs.push(v);
    return v;
  }

  initializer(name: string, data: TensorData | number[], shape: number[], dtype?: DType): Var {
    if (this.usedNames.has(name)) throw new GraphError(`initializer "${name}" is already defined`);
    const dt: DType =
      dtype ??
      (data instanceof Float64Array
        ? 'float64'
        : data instanceof BigInt64Array
          ? 'int64'
          : data instanceof Int32Array
            ? 'int32'
            : data instanceof Uint8Array
              ? 'uint8'
              : data instanceof Int8Array
                ? 'int8'
                : data instanceof Uint16Array
                  ? 'float16'
                  : 'float32');
    const arr = Array.isArray(data) ? typedFor(dt, data) : data;
    const n = shape.reduce((a, b) => a * b, 1);
    if (arr.length !== n)
      throw new GraphError(`initializer "${name}": ${arr.length} values for shape ${fmtShape(shape)} (${n} expected)`);
    this.usedNames.add(name);
    this.inits.push({ name, dtype: dt, shape, data: arr });
    return this.newVar(name, dt, shape);
  }

  /** A scalar (number) or 1-D (array) constant, cached by value. */
  const(value: number | number[], dtype: DType = this.float): Var {
    const key = `${dtype}:${Array.isArray(value) ? `[${value.join(',')}]` : value}`;
    const hit = this.constCache.get(key);
    if (hit) return hit;
    const vals = Array.isArray(value) ? value : [value];
    const shape = Array.isArray(value) ? [value.length] : [];
    const name = this.uniqueNameGlobal(
      `const/${dtype}_${Array.isArray(value) ? 'vec' : String(value).replace(/[^0-9a-zA-Z.-]/g, '_')}`,
    );
    this.inits.push({ name, dtype, shape, data: typedFor(dtype, vals) });
    const v = this.newVar(name, dtype, shape);
    this.constCache.set(key, v);
    return v;
  }

  private uniqueNameGlobal(base: string): string {
    let name = base,
      i = 1;
    while (this.usedNames.has(name)) name = `${base}_${i++}`;
    this.usedNames.add(name);
    return name;
  }

  output(v: Var, name?: string): Var {
    let out = v;
    if (name !== undefined && name !== v.name) {
      if (this.usedNames.has(name)) throw new GraphError(`output name "${name}" is already used`);
      this.usedNames.add(name);
      out = this.newVar(name, v.dtype, v.shape);
      // a unique node name: an output "loss" must not collide with a node of scope "loss"
      this.nodes.push({
        opType: 'Identity',
        name: this.uniqueNameGlobal(`${name}/identity`),
        inputs: [v.name],
        outputs: [name],
        attrs: {},
        domain: '',
        outputAlias: true,
      });
    }
    if (this.outputs.some((o) => o.name === out.name)) throw new GraphError(`"${out.name}" is already an output`);
    this.outputs.push(out);
    return out;
  }

  get inputVars(): readonly Var[] {
    return this.inputs;
  }
  get outputVars(): readonly Var[] {
    return this.outputs;
  }
  get nodeCount(): number {
    return this.nodes.length;
  }

  // ───────────────────────────── core emission ─────────────────────────────

  private emit(
    opType: string,
    inputs: (Var | null)[],
    outs: OutSpec[],
    attrs: Record<string, AttrValue> = {},
    domain = '',
    label?: string,
  ): Var[] {
    for (const i of inputs)
      if (i && i.builder !== this) throw new GraphError(`${opType}: input ${i.name} belongs to another builder`);
    const nodeName = this.uniqueName(label ?? opType.toLowerCase());
    const outVars = outs.map((o, k) => {
      const vname = outs.length === 1 ? nodeName : `${nodeName}:${k}`;
      if (k > 0 || outs.length > 1) this.usedNames.add(vname);
      return this.newVar(vname, o.dtype, o.shape);
    });
    this.nodes.push({
      opType,
      name: nodeName,
      inputs: inputs.map((i) => (i ? i.name : '')),
      outputs: outVars.map((v) => v.name),
      attrs,
      domain,
    });
    if (domain && domain !== 'ai.onnx' && !this.extraDomains.has(domain)) this.extraDomains.set(domain, 1);
    return outVars;
  }

  private emit1(opType: string, inputs: (Var | null)[], out: OutSpec, attrs: Record<string, AttrValue> = {}): Var {
    return this.emit(opType, inputs, [out], attrs)[0];
  }

  /** Record a backward rule for outputs computed from inputs (used by composite ops). */
  customVjp(inputs: (Var | null)[], outputs: Var[], vjp: Vjp): void {
    this.tape.push({ inputs, outputs, vjp, scope: this.currentScope });
  }

  /** Escape hatch: any ONNX op, forward only (no gradient flows through it). */
  op(type: string, inputs: (Var | null)[], attrs: Record<string, AttrValue>, outs: OutSpec): Var;
  op(type: string, inputs: (Var | null)[], attrs: Record<string, AttrValue>, outs: OutSpec[], domain?: string): Var[];
  op(type: string, inputs: (Var | null)[], attrs: Record<string, AttrValue>, outs: OutSpec, domain?: string): Var;
  op(
    type: string,
    inputs: (Var | null)[],
    attrs: Record<string, AttrValue>,
    outs: OutSpec | OutSpec[],
    domain = '',
  ): Var | Var[] {
    const r = this.emit(type, inputs, Array.isArray(outs) ? outs : [outs], attrs, domain);
    return Array.isArray(outs) ? r : r[0];
  }

  /** Set the opset version of a non-default domain used by `op(..., domain)` (default 1). */
  useDomain(domain: string, version: number): void {
    this.extraDomains.set(domain, version);
  }

  private lift(x: Operand, like: Var): Var {
    return typeof x === 'number' ? this.const(x, like.dtype) : x;
  }

  // ───────────────────────────── runtime dims ─────────────────────────────

  /** An int64 [1] tensor holding the runtime value of `d`. */
  dimTensor(d: Dim): Var {
    const c = canonDim(d);
    const key = String(c);
    const hit = this.dimTensorCache.get(key);
    if (hit) return hit;
    const v = this.scopeRoot(() => this.buildDim(parseDim(c), d));
    this.dimTensorCache.set(key, v);
    return v;
  }

  private scopeRoot<R>(fn: () => R): R {
    const saved = this.scopes;
    this.scopes = ['dims'];
    try {
      return fn();
    } finally {
      this.scopes = saved;
    }
  }

  private buildDim(e: DimExpr, orig: Dim): Var {
    switch (e.kind) {
      case 'num':
        return this.const([e.v], 'int64');
      case 'atom': {
        const src = this.dimSources.get(e.name);
        if (!src)
          throw new GraphError(
            `dimension "${e.name}" (in ${orig}) is not the dimension of any input or op output, so it cannot be computed at runtime`,
          );
        return this.emit1('Shape', [src.v], { dtype: 'int64', shape: [1] }, { start: src.axis, end: src.axis + 1 });
      }
      case 'mul':
      case 'add': {
        let acc = this.buildDim(e.args[0], orig);
        for (const a of e.args.slice(1))
          acc = this.emit1(e.kind === 'mul' ? 'Mul' : 'Add', [acc, this.buildDim(a, orig)], {
            dtype: 'int64',
            shape: [1],
          });
        return acc;
      }
    }
  }

  /**
   * Name the runtime value of an int64 [1] tensor as the symbolic dim `name` (an atom), so that
   * shapes can use it (a split's sizes, a slice's end). Names are global to the graph: a second
   * call with the same name returns it unchanged and must mean the same value.
   */
  namedDim(value: Var, name: string): string {
    if (!isAtom(name) || name.startsWith('?')) throw new GraphError(`namedDim: "${name}" is not a dim name`);
    if (value.dtype !== 'int64' || value.rank !== 1 || value.shape[0] !== 1)
      throw new GraphError(`namedDim: ${value.name} must be int64 [1], got ${value.dtype}${fmtShape(value.shape)}`);
    if (this.dimSources.has(name)) return name;
    this.scopeRoot(() => this.emit1('ConstantOfShape', [value], { dtype: 'float32', shape: [name] }));
    this.dimTensorCache.set(name, value);
    this.namedDims.add(name);
    return name;
  }

  /** An int64 [rank] tensor holding the runtime shape. */
  shapeTensor(shape: Shape): Var {
    if (shape.every((d) => typeof d === 'number')) return this.const(shape as number[], 'int64');
    return this.scopeRoot(() =>
      this.emit1(
        'Concat',
        shape.map((d) => this.dimTensor(d)),
        { dtype: 'int64', shape: [shape.length] },
        { axis: 0 },
      ),
    );
  }

  // ───────────────────────────── broadcasting helpers ─────────────────────────────

  broadcastShapes(a: Shape, b: Shape, what: string): Shape {
    const n = Math.max(a.length, b.length);
    const out: Dim[] = [];
    for (let i = 0; i < n; i++) {
      const da = a[a.length - n + i] ?? 1,
        db = b[b.length - n + i] ?? 1;
      if (dimEq(da, db)) out.push(da);
      else if (da === 1) out.push(db);
      else if (db === 1) out.push(da);
      else
        throw new GraphError(
          `${what}: cannot broadcast ${fmtShape(a)} with ${fmtShape(b)} (in scope "${this.currentScope}")`,
        );
    }
    return out;
  }

  /** Sum `g` (a broadcast result) back down to `shape`. */
  sumTo(g: Var, shape: Shape): Var {
    if (shapeEq(g.shape, shape)) return g;
    const k = g.rank - shape.length;
    if (k < 0) throw new GraphError(`sumTo: gradient ${fmtShape(g.shape)} has lower rank than ${fmtShape(shape)}`);
    const axes: number[] = [];
    for (let i = 0; i < g.rank; i++) {
      if (i < k) axes.push(i);
      else if (!dimEq(shape[i - k], g.shape[i])) {
        if (shape[i - k] !== 1) throw new GraphError(`sumTo: cannot reduce ${fmtShape(g.shape)} to ${fmtShape(shape)}`);
        axes.push(i);
      }
    }
    let r = axes.length ? this.reduceSum(g, axes, true) : g;
    if (k > 0)
      r = this.squeeze(
        r,
        Array.from({ length: k }, (_, i) => i),
      );
    return r;
  }

  // ───────────────────────────── elementwise ─────────────────────────────

  private binary(opType: string, a: Operand, b: Operand, outDtype?: DType): Var {
    return this.binary3(opType, a, b, outDtype)[0];
  }

  private binary3(opType: string, a: Operand, b: Operand, outDtype?: DType): [Var, Var, Var] {
    const like = typeof a === 'number' ? (b as Var) : a;
    if (typeof like === 'number') throw new GraphError(`${opType}: at least one operand must be a Var`);
    const A = this.lift(a, like),
      B = this.lift(b, like);
    if (A.dtype !== B.dtype)
      throw new GraphError(
        `${opType}: dtype mismatch ${A.name} ${A.dtype} vs ${B.name} ${B.dtype} (in scope "${this.currentScope}")`,
      );
    const shape = this.broadcastShapes(A.shape, B.shape, opType);
    return [this.emit1(opType, [A, B], { dtype: outDtype ?? A.dtype, shape }), A, B];
  }

  private unary(opType: string, x: Var, attrs: Record<string, AttrValue> = {}): Var {
    return this.emit1(opType, [x], { dtype: x.dtype, shape: x.shape }, attrs);
  }

  add(a: Operand, b: Operand): Var {
    const [y, A0, A1] = this.binary3('Add', a, b);
    const A = [A0, A1];
    this.record(A, [y], ([g]) => [this.sumTo(g!, A[0].shape), this.sumTo(g!, A[1].shape)]);
    return y;
  }

  sub(a: Operand, b: Operand): Var {
    const [y, A0, A1] = this.binary3('Sub', a, b);
    const A = [A0, A1];
    this.record(A, [y], ([g]) => [this.sumTo(g!, A[0].shape), this.sumTo(this.neg(g!), A[1].shape)]);
    return y;
  }

  mul(a: Operand, b: Operand): Var {
    const [y, x0, x1] = this.binary3('Mul', a, b);
    this.record([x0, x1], [y], ([g]) => [
      this.sumTo(this.mul(g!, x1), x0.shape),
      this.sumTo(this.mul(g!, x0), x1.shape),
    ]);
    return y;
  }

  div(a: Operand, b: Operand): Var {
    const [y, x0, x1] = this.binary3('Div', a, b);
    this.record([x0, x1], [y], ([g]) => {
      const gx0 = this.div(g!, x1);
      return [this.sumTo(gx0, x0.shape), this.sumTo(this.neg(this.mul(gx0, y)), x1.shape)];
    });
    return y;
  }

  neg(x: Var): Var {
    const y = this.unary('Neg', x);
    this.record([x], [y], ([g]) => [this.neg(g!)]);
    return y;
  }
  exp(x: Var): Var {
    const y = this.unary('Exp', x);
    this.record([x], [y], ([g]) => [this.mul(g!, y)]);
    return y;
  }
  log(x: Var): Var {
    const y = this.unary('Log', x);
    this.record([x], [y], ([g]) => [this.div(g!, x)]);
    return y;
  }
  sqrt(x: Var): Var {
    const y = this.unary('Sqrt', x);
    this.record([x], [y], ([g]) => [this.div(this.mul(g!, 0.5), y)]);
    return y;
  }
  reciprocal(x: Var): Var {
    const y = this.unary('Reciprocal', x);
    this.record([x], [y], ([g]) => [this.neg(this.mul(g!, this.mul(y, y)))]);
    return y;
  }
  tanh(x: Var): Var {
    const y = this.unary('Tanh', x);
    this.record([x], [y], ([g]) => [this.mul(g!, this.sub(1, this.mul(y, y)))]);
    return y;
  }
  sigmoid(x: Var): Var {
    const y = this.unary('Sigmoid', x);
    this.record([x], [y], ([g]) => [this.mul(g!, this.mul(y, this.sub(1, y)))]);
    return y;
  }
  /** |x|; gradient sign(x) (0 at 0, as torch). */
  abs(x: Var): Var {
    const y = this.unary('Abs', x);
    this.record([x], [y], ([g]) => [this.mul(g!, this.sign(x))]);
    return y;
  }
  square(x: Var): Var {
    return this.mul(x, x);
  }

  /** x^p for a constant exponent p. */
  pow(x: Var, p: number): Var {
    const y = this.emit1('Pow', [x, this.const(p, x.dtype)], { dtype: x.dtype, shape: x.shape });
    this.record([x], [y], ([g]) => [this.mul(g!, this.mul(p, this.pow(x, p - 1)))]);
    return y;
  }

  /** Elementwise max; the gradient goes to `a` where a ≥ b, else to `b`. */
  max(a: Operand, b: Operand): Var {
    const [y, x0, x1] = this.binary3('Max', a, b);
    this.record([x0, x1], [y], ([g]) => {
      const m = this.greaterOrEqual(x0, x1);
      const z = this.const(0, g!.dtype);
      return [this.sumTo(this.where(m, g!, z), x0.shape), this.sumTo(this.where(m, z, g!), x1.shape)];
    });
    return y;
  }

  /** Elementwise min; the gradient goes to `a` where a ≤ b, else to `b`. */
  min(a: Operand, b: Operand): Var {
    const [y, x0, x1] = this.binary3('Min', a, b);
    this.record([x0, x1], [y], ([g]) => {
      const m = this.lessOrEqual(x0, x1);
      const z = this.const(0, g!.dtype);
      return [this.sumTo(this.where(m, g!, z), x0.shape), this.sumTo(this.where(m, z, g!), x1.shape)];
    });
    return y;
  }

  /** clamp(x, lo, hi) with constant bounds; the gradient passes where lo ≤ x ≤ hi (torch.clamp). */
  clip(x: Var, lo?: number, hi?: number): Var {
    const y = this.emit1(
      'Clip',
      [x, lo === undefined ? null : this.const(lo, x.dtype), hi === undefined ? null : this.const(hi, x.dtype)],
      { dtype: x.dtype, shape: x.shape },
    );
    this.record([x], [y], ([g]) => {
      let m: Var | null = null;
      if (lo !== undefined) m = this.greaterOrEqual(x, lo);
      if (hi !== undefined) {
        const m2 = this.lessOrEqual(x, hi);
        m = m ? this.and(m, m2) : m2;
      }
      return [m ? this.where(m, g!, this.const(0, g!.dtype)) : g];
    });
    return y;
  }

  where(cond: Var, a: Operand, b: Operand): Var {
    if (cond.dtype !== 'bool') throw new GraphError(`Where: condition ${cond.name} must be bool, got ${cond.dtype}`);
    const like = typeof a === 'number' ? (b as Var) : a;
    if (typeof like === 'number') throw new GraphError('Where: at least one branch must be a Var');
    const A = this.lift(a, like),
      B = this.lift(b, like);
    if (A.dtype !== B.dtype) throw new GraphError(`Where: dtype mismatch ${A.dtype} vs ${B.dtype}`);
    const shape = this.broadcastShapes(this.broadcastShapes(cond.shape, A.shape, 'Where'), B.shape, 'Where');
    const y = this.emit1('Where', [cond, A, B], { dtype: A.dtype, shape });
    this.record([cond, A, B], [y], ([g]) => {
      const z = this.const(0, g!.dtype);
      return [null, this.sumTo(this.where(cond, g!, z), A.shape), this.sumTo(this.where(cond, z, g!), B.shape)];
    });
    return y;
  }

  // comparisons and logic (no gradient)
  equal(a: Operand, b: Operand): Var {
    return this.binary('Equal', a, b, 'bool');
  }
  less(a: Operand, b: Operand): Var {
    return this.binary('Less', a, b, 'bool');
  }
  lessOrEqual(a: Operand, b: Operand): Var {
    return this.binary('LessOrEqual', a, b, 'bool');
  }
  greater(a: Operand, b: Operand): Var {
    return this.binary('Greater', a, b, 'bool');
  }
  greaterOrEqual(a: Operand, b: Operand): Var {
    return this.binary('GreaterOrEqual', a, b, 'bool');
  }
  and(a: Var, b: Var): Var {
    return this.binary('And', a, b, 'bool');
  }
  or(a: Var, b: Var): Var {
    return this.binary('Or', a, b, 'bool');
  }
  not(x: Var): Var {
    return this.emit1('Not', [x], { dtype: 'bool', shape: x.shape });
  }
  isNaN(x: Var): Var {
    return this.emit1('IsNaN', [x], { dtype: 'bool', shape: x.shape });
  }
  isInf(x: Var): Var {
    return this.emit1('IsInf', [x], { dtype: 'bool', shape: x.shape });
  }
  sign(x: Var): Var {
    return this.unary('Sign', x);
  }

  cast(x: Var, to: DType): Var {
    if (x.dtype === to) return x;
    const y = this.emit1('Cast', [x], { dtype: to, shape: x.shape }, { to: ONNX_DTYPE[to] });
    if (isFloatType(x.dtype) && isFloatType(to)) this.record([x], [y], ([g]) => [this.cast(g!, x.dtype)]);
    return y;
  }

  identity(x: Var): Var {
    const y = this.unary('Identity', x);
    this.record([x], [y], ([g]) => [g]);
    return y;
  }

  /** The same value with no gradient flowing back through it. */
  stopGradient(x: Var): Var {
    return this.unary('Identity', x);
  }

  // ───────────────────────────── linear algebra ─────────────────────────────

  /** numpy-style matmul of rank ≥ 2 operands with broadcast batch dims. */
  matmul(a: Var, b: Var): Var {
    if (a.rank < 2 || b.rank < 2)
      throw new GraphError(`MatMul: operands must have rank ≥ 2, got ${fmtShape(a.shape)} and ${fmtShape(b.shape)}`);
    if (a.dtype !== b.dtype) throw new GraphError(`MatMul: dtype mismatch ${a.dtype} vs ${b.dtype}`);
    const [m, k1] = a.shape.slice(-2),
      [k2, n] = b.shape.slice(-2);
    if (!dimEq(k1, k2))
      throw new GraphError(
        `MatMul: inner dims differ: ${a.name} ${fmtShape(a.shape)} @ ${b.name} ${fmtShape(b.shape)} (in scope "${this.currentScope}")`,
      );
    const batch = this.broadcastShapes(a.shape.slice(0, -2), b.shape.slice(0, -2), 'MatMul batch');
    const y = this.emit1('MatMul', [a, b], { dtype: a.dtype, shape: [...batch, m, n] });
    this.record([a, b], [y], ([g]) => {
      let ga: Var, gb: Var;
      if (b.rank === 2 && a.rank > 2) {
        // y = a[..., K] @ b[K, N]: fold the batch into rows so both products are single GEMMs.
        const K = a.shape[a.rank - 1];
        const a2 = this.reshape(a, [numel(a.shape.slice(0, -1)), K]);
        const g2 = this.reshape(g!, [numel(g!.shape.slice(0, -1)), n]);
        ga = this.reshape(this.gemm(g2, b, { transB: true }), a.shape);
        gb = this.gemm(a2, g2, { transA: true });
        return [ga, gb];
      }
      ga = this.sumTo(this.matmul(g!, this.transposeLast2(b)), a.shape);
      gb = this.sumTo(this.matmul(this.transposeLast2(a), g!), b.shape);
      return [ga, gb];
    });
    return y;
  }

  transposeLast2(x: Var): Var {
    const perm = Array.from({ length: x.rank }, (_, i) => i);
    [perm[x.rank - 2], perm[x.rank - 1]] = [perm[x.rank - 1], perm[x.rank - 2]];
    return this.transpose(x, perm);
  }

  /** 2-D Gemm: alpha · op(a) @ op(b) (+ c, broadcast to [M, N]). */
  gemm(a: Var, b: Var, opts: { transA?: boolean; transB?: boolean; alpha?: number; c?: Var } = {}): Var {
    if (a.rank !== 2 || b.rank !== 2)
      throw new GraphError(
        `Gemm: operands must be 2-D, got ${fmtShape(a.shape)} and ${fmtShape(b.shape)} (in scope "${this.currentScope}")`,
      );
    const tA = !!opts.transA,
      tB = !!opts.transB,
      alpha = opts.alpha ?? 1;
    const [m, k1] = tA ? [a.shape[1], a.shape[0]] : a.shape;
    const [k2, n] = tB ? [b.shape[1], b.shape[0]] : b.shape;
    if (!dimEq(k1, k2))
      throw new GraphError(
        `Gemm: inner dims differ: ${a.name} ${fmtShape(a.shape)}${tA ? 'ᵀ' : ''} · ${b.name} ${fmtShape(b.shape)}${tB ? 'ᵀ' : ''} (in scope "${this.currentScope}")`,
      );
    const attrs: Record<string, AttrValue> = {};
    if (tA) attrs.transA = 1;
    if (tB) attrs.transB = 1;
    if (alpha !== 1) attrs.alpha = floatAttr(alpha);
    const c = opts.c ?? null;
    if (c) this.broadcastShapes([m, n], c.shape, 'Gemm bias');
    const y = this.emit1('Gemm', c ? [a, b, c] : [a, b], { dtype: a.dtype, shape: [m, n] }, attrs);
    this.record(c ? [a, b, c] : [a, b], [y], ([g]) => {
      const G = g!;
      // y = α·A'B' with A' = op(a), B' = op(b); dA' = α·G B'ᵀ, dB' = α·A'ᵀ G
      const ga = tA ? this.gemm(b, G, { transA: tB, transB: true, alpha }) : this.gemm(G, b, { transB: !tB, alpha });
      const gb = tB ? this.gemm(G, a, { transA: true, transB: tA, alpha }) : this.gemm(a, G, { transA: !tA, alpha });
      const res: (Var | null)[] = [ga, gb];
      if (c) res.push(this.sumTo(G, c.shape));
      return res;
    });
    return y;
  }

  // ───────────────────────────── shape ops ─────────────────────────────

  /** Reshape to a shape with static and/or symbolic dims (element counts are checked when comparable). */
  reshape(x: Var, shape: Shape): Var {
    const target = shape.map(canonDim);
    if (shapeEq(x.shape, target)) return x;
    const nIn = numel(x.shape),
      nOut = numel(target);
    if (isKnown(nIn) && isKnown(nOut) && !dimEq(nIn, nOut) && !String(nIn).includes('+') && !String(nOut).includes('+'))
      throw new GraphError(
        `Reshape ${x.name}: ${fmtShape(x.shape)} (${nIn} elements) cannot become ${fmtShape(target)} (${nOut} elements)`,
      );
    const symbolic = target.map((d, i) => (typeof d === 'number' ? -1 : i)).filter((i) => i >= 0);
    let shapeVar: Var;
    if (symbolic.length === 0) shapeVar = this.const(target as number[], 'int64');
    else if (symbolic.length === 1)
      shapeVar = this.const(
        target.map((d) => (typeof d === 'number' ? d : -1)),
        'int64',
      );
    else {
      // reuse dims of x that stay in place (0 = copy from input), infer at most one with -1
      const vals: (number | null)[] = target.map((d, i) =>
        typeof d === 'number' ? d : i < x.rank && dimEq(x.shape[i], d) ? 0 : null,
      );
      const unresolved = vals.filter((v) => v === null).length;
      if (unresolved <= 1)
        shapeVar = this.const(
          vals.map((v) => (v === null ? -1 : v)),
          'int64',
        );
      else shapeVar = this.shapeTensor(target);
    }
    const y = this.emit1('Reshape', [x, shapeVar], { dtype: x.dtype, shape: target });
    this.record([x, null], [y], ([g]) => [this.reshape(g!, x.shape), null]);
    return y;
  }

  transpose(x: Var, perm: number[]): Var {
    if (perm.length !== x.rank || [...perm].sort((a, b) => a - b).some((p, i) => p !== i))
      throw new GraphError(`Transpose ${x.name}: perm [${perm}] is not a permutation of rank ${x.rank}`);
    const y = this.emit1('Transpose', [x], { dtype: x.dtype, shape: perm.map((p) => x.shape[p]) }, { perm });
    const inv = perm.map((_, i) => perm.indexOf(i));
    this.record([x], [y], ([g]) => [this.transpose(g!, inv)]);
    return y;
  }

  unsqueeze(x: Var, axes: number[]): Var {
    const rank = x.rank + axes.length;
    const ax = axes.map((a) => normAxis(a, rank, 'Unsqueeze')).sort((a, b) => a - b);
    const shape: Dim[] = [];
    let j = 0;
    for (let i = 0; i < rank; i++) shape.push(ax.includes(i) ? 1 : x.shape[j++]);
    const y = this.emit1('Unsqueeze', [x, this.const(ax, 'int64')], { dtype: x.dtype, shape });
    this.record([x, null], [y], ([g]) => [this.squeeze(g!, ax), null]);
    return y;
  }

  squeeze(x: Var, axes: number[]): Var {
    const ax = axes.map((a) => normAxis(a, x.rank, 'Squeeze'));
    for (const a of ax)
      if (x.shape[a] !== 1) throw new GraphError(`Squeeze ${x.name}: axis ${a} has size ${x.shape[a]}, not 1`);
    const shape = x.shape.filter((_, i) => !ax.includes(i));
    const y = this.emit1('Squeeze', [x, this.const(ax, 'int64')], { dtype: x.dtype, shape });
    this.record([x, null], [y], ([g]) => [this.unsqueeze(g!, ax), null]);
    return y;
  }

  /** Concatenate along `axis`; `size`: the result's dim there, where the inputs' sizes are named dims (namedDim) known to add up to it. */
  concat(xs: Var[], axis: number, size?: Dim): Var {
    if (xs.length === 0) throw new GraphError('Concat: no inputs');
    const rank = xs[0].rank,
      a = normAxis(axis, rank, 'Concat');
    for (const x of xs) {
      if (x.rank !== rank || x.dtype !== xs[0].dtype || x.shape.some((d, i) => i !== a && !dimEq(d, xs[0].shape[i])))
        throw new GraphError(
          `Concat on axis ${a}: incompatible ${xs.map((v) => `${v.name} ${v.dtype}${fmtShape(v.shape)}`).join(', ')}`,
        );
    }
    const shape = [...xs[0].shape];
    shape[a] = xs.slice(1).reduce<Dim>((s, x) => dimAdd(s, x.shape[a]), xs[0].shape[a]);
    if (size !== undefined && !dimEq(size, shape[a])) {
      if (!xs.some((x) => this.namedDims.has(String(x.shape[a]))))
        throw new GraphError(`Concat on axis ${a}: sizes add up to ${shape[a]}, not ${size}`);
      shape[a] = size;
    }
    const y = this.emit1('Concat', xs, { dtype: xs[0].dtype, shape }, { axis: a });
    this.record(xs, [y], ([g]) =>
      this.split(
        g!,
        a,
        xs.map((x) => x.shape[a]),
      ),
    );
    return y;
  }

  /** Split along `axis` into pieces of the given sizes. */
  split(x: Var, axis: number, sizes: Dim[]): Var[] {
    const a = normAxis(axis, x.rank, 'Split');
    const total = sizes.reduce<Dim>((s, d) => dimAdd(s, d), 0);
    // sizes named by namedDim are runtime values: their sum cannot be checked here
    if (
      isKnown(total) &&
      isKnown(x.shape[a]) &&
      !sizes.some((d) => this.namedDims.has(String(d))) &&
      !dimEq(total, x.shape[a])
    )
      throw new GraphError(`Split ${x.name}: sizes [${sizes}] do not add up to dim ${x.shape[a]}`);
    const ys = this.emit(
      'Split',
      [x, this.shapeTensor(sizes)],
      sizes.map((s) => ({ dtype: x.dtype, shape: x.shape.map((d, i) => (i === a ? s : d)) })),
      { axis: a },
    );
    this.record([x, null], ys, (gs) => {
      const parts = gs.map((g, i) => g ?? this.zerosLike(ys[i]));
      return [parts.length === 1 ? parts[0] : this.concat(parts, a, x.shape[a]), null];
    });
    return ys;
  }

  /** x[start:end] along `axis` (start ≥ 0; `end` a static or symbolic dim; default: to the end). */
  slice(x: Var, axis: number, start: number, end?: Dim): Var {
    const a = normAxis(axis, x.rank, 'Slice');
    const dim = x.shape[a];
    if (start < 0 || (typeof end === 'number' && end < start))
      throw new GraphError(`Slice ${x.name}: need 0 ≤ start ≤ end, got ${start}:${end}`);
    if (typeof dim === 'number' && typeof end === 'number' && end > dim)
      throw new GraphError(`Slice ${x.name}: end ${end} beyond dim ${dim}`);
    const endDim: Dim = end ?? dim;
    let outDim: Dim;
    if (start === 0) outDim = endDim;
    else if (typeof endDim === 'number') outDim = endDim - start;
    else outDim = this.unknownDim();
    const shape = x.shape.map((d, i) => (i === a ? outDim : d));
    const endT = end === undefined ? this.const([2 ** 62], 'int64') : this.dimTensor(end);
    const y = this.emit1('Slice', [x, this.const([start], 'int64'), endT, this.const([a], 'int64')], {
      dtype: x.dtype,
      shape,
    });
    this.record([x, null, null, null], [y], ([g]) => {
      const pads = new Array<Var>(2 * x.rank).fill(this.const([0], 'int64'));
      pads[a] = this.const([start], 'int64');
      if (end !== undefined && !dimEq(end, dim)) {
        pads[x.rank + a] =
          typeof dim === 'number' && typeof end === 'number'
            ? this.const([dim - end], 'int64')
            : this.emit1('Sub', [this.dimTensor(dim), this.dimTensor(end)], { dtype: 'int64', shape: [1] });
      }
      const padsT = this.emit1('Concat', pads, { dtype: 'int64', shape: [2 * x.rank] }, { axis: 0 });
      return [this.emit1('Pad', [g!, padsT], { dtype: g!.dtype, shape: x.shape }), null, null, null];
    });
    return y;
  }

  /** Gather along axis 0 of `data` (gradient by ScatterElements with reduction=add; safe with threads). */
  gather(data: Var, indices: Var, axis = 0): Var {
    if (indices.dtype !== 'int64' && indices.dtype !== 'int32')
      throw new GraphError(`Gather: indices ${indices.name} must be int32/int64, got ${indices.dtype}`);
    const a = normAxis(axis, data.rank, 'Gather');
    const shape = [...data.shape.slice(0, a), ...indices.shape, ...data.shape.slice(a + 1)];
    const y = this.emit1('Gather', [data, indices], { dtype: data.dtype, shape }, { axis: a });
    this.record([data, null], [y], ([g]) => {
      if (a !== 0) throw new GraphError(`Gather: gradient only implemented for axis 0 (${data.name})`);
      const rest = data.shape.slice(1);
      const width = numel(rest);
      const n = numel(indices.shape);
      const idx = this.cast(this.reshape(indices, [n, 1]), 'int64');
      const g2 = this.reshape(g!, [n, width]);
      const idx2 = this.emit1('Expand', [idx, this.shapeTensor([n, width])], { dtype: 'int64', shape: [n, width] });
      const into = (base: Var) =>
        this.reshape(
          this.emit1(
            'ScatterElements',
            [this.reshape(base, [data.shape[0], width]), idx2, g2],
            { dtype: data.dtype, shape: [data.shape[0], width] },
            { axis: 0, reduction: 'add' },
          ),
          data.shape,
        );
      return [this.scatterGrad(into(this.zeros(data.shape, data.dtype)), into), null];
    });
    return y;
  }

  /** GatherElements (indices same rank as data). Gradient: ScatterElements(add) into zeros. */
  gatherElements(data: Var, indices: Var, axis: number): Var {
    const a = normAxis(axis, data.rank, 'GatherElements');
    if (indices.rank !== data.rank)
      throw new GraphError(`GatherElements: indices rank ${indices.rank} ≠ data rank ${data.rank}`);
    const y = this.emit1('GatherElements', [data, indices], { dtype: data.dtype, shape: indices.shape }, { axis: a });
    this.record([data, null], [y], ([g]) => {
      const into = (base: Var) =>
        this.emit1(
          'ScatterElements',
          [base, indices, g!],
          { dtype: data.dtype, shape: data.shape },
          { axis: a, reduction: 'add' },
        );
      return [this.scatterGrad(into(this.zerosLike(data)), into), null];
    });
    return y;
  }

  expand(x: Var, shape: Shape): Var {
    const out = this.broadcastShapes(x.shape, shape, 'Expand');
    const y = this.emit1('Expand', [x, this.shapeTensor(shape)], { dtype: x.dtype, shape: out });
    this.record([x, null], [y], ([g]) => [this.sumTo(g!, x.shape), null]);
    return y;
  }

  /** Zeros of a (possibly symbolic) shape. */
  zeros(shape: Shape, dtype: DType = this.float): Var {
    return this.emit1(
      'ConstantOfShape',
      [this.shapeTensor(shape)],
      { dtype, shape },
      { value: tensorAttr(typedFor(dtype, [0]), [1], dtype) },
    );
  }

  zerosLike(x: Var): Var {
    const s = this.emit1('Shape', [x], { dtype: 'int64', shape: [x.rank] });
    return this.emit1(
      'ConstantOfShape',
      [s],
      { dtype: x.dtype, shape: x.shape },
      { value: tensorAttr(typedFor(x.dtype, [0]), [1], x.dtype) },
    );
  }

  shape(x: Var): Var {
    return this.emit1('Shape', [x], { dtype: 'int64', shape: [x.rank] });
  }

  /** int64 range [0, n) where n is a static or symbolic dim. */
  range(n: Dim, dtype: DType = 'int64'): Var {
    const limit = this.emit1('Squeeze', [this.dimTensor(n), this.const([0], 'int64')], { dtype: 'int64', shape: [] });
    const lim = dtype === 'int64' ? limit : this.cast(limit, dtype);
    return this.emit1('Range', [this.const(0, dtype), lim, this.const(1, dtype)], { dtype, shape: [n] });
  }

  // ───────────────────────────── reductions ─────────────────────────────

  private reducedShape(x: Var, axes: number[], keepdims: boolean): { ax: number[]; shape: Dim[] } {
    const ax = axes.map((a) => normAxis(a, x.rank, 'Reduce')).sort((a, b) => a - b);
    const shape: Dim[] = [];
    x.shape.forEach((d, i) => {
      if (!ax.includes(i)) shape.push(d);
      else if (keepdims) shape.push(1);
    });
    return { ax, shape };
  }

  reduceSum(x: Var, axes: number[], keepdims = false): Var {
    const { ax, shape } = this.reducedShape(x, axes, keepdims);
    const y = this.emit1(
      'ReduceSum',
      [x, this.const(ax, 'int64')],
      { dtype: x.dtype, shape },
      { keepdims: keepdims ? 1 : 0 },
    );
    this.record([x, null], [y], ([g]) => {
      const gk = keepdims ? g! : this.unsqueeze(g!, ax);
      return [this.expand(gk, x.shape), null];
    });
    return y;
  }

  reduceMean(x: Var, axes: number[], keepdims = false): Var {
    const { ax, shape } = this.reducedShape(x, axes, keepdims);
    const y = this.emit1('ReduceMean', [x], { dtype: x.dtype, shape }, { axes: ax, keepdims: keepdims ? 1 : 0 });
    this.record([x], [y], ([g]) => {
      const count = ax.reduce<Dim>((p, a) => dimMul(p, x.shape[a]), 1);
      const c: Var =
        typeof count === 'number'
          ? this.const(count, g!.dtype)
          : this.emit1('Cast', [this.dimTensor(count)], { dtype: g!.dtype, shape: [1] }, { to: ONNX_DTYPE[g!.dtype] });
      const gk = keepdims ? g! : this.unsqueeze(g!, ax);
      return [this.expand(this.div(gk, c), x.shape)];
    });
    return y;
  }

  /** Max over axes (no gradient). */
  reduceMax(x: Var, axes: number[], keepdims = false): Var {
    const { ax, shape } = this.reducedShape(x, axes, keepdims);
    return this.emit1('ReduceMax', [x], { dtype: x.dtype, shape }, { axes: ax, keepdims: keepdims ? 1 : 0 });
  }

  argMax(x: Var, axis: number, keepdims = false): Var {
    const { shape } = this.reducedShape(x, [axis], keepdims);
    return this.emit1(
      'ArgMax',
      [x],
      { dtype: 'int64', shape },
      { axis: normAxis(axis, x.rank, 'ArgMax'), keepdims: keepdims ? 1 : 0 },
    );
  }

  softmax(x: Var, axis = -1): Var {
    const a = normAxis(axis, x.rank, 'Softmax');
    const y = this.emit1('Softmax', [x], { dtype: x.dtype, shape: x.shape }, { axis: a });
    // dx = y ⊙ (g − Σ_a g⊙y)
    this.record([x], [y], ([g]) => [this.mul(y, this.sub(g!, this.reduceSum(this.mul(g!, y), [a], true)))]);
    return y;
  }

  logSoftmax(x: Var, axis = -1): Var {
    const a = normAxis(axis, x.rank, 'LogSoftmax');
    const y = this.emit1('LogSoftmax', [x], { dtype: x.dtype, shape: x.shape }, { axis: a });
    // dx = g − softmax(x) · Σ_a g
    this.record([x], [y], ([g]) => [this.sub(g!, this.mul(this.exp(y), this.reduceSum(g!, [a], true)))]);
    return y;
  }

  // ───────────────────────────── autodiff ─────────────────────────────

  /**
   * Gradients that are a scatter-add into zeros, with the same scatter into any base: when another
   * gradient reaches the same value (a tied embedding: the LM head's), backprop scatters into that
   * one instead of adding the two, so no zeros tensor of the table's size exists and no Add runs.
   */
  private readonly scatterInto = new WeakMap<Var, (base: Var) => Var>();
  private scatterGrad(g: Var, into: (base: Var) => Var): Var {
    this.scatterInto.set(g, into);
    return g;
  }
  /** The sum of two gradient contributions (a scatter-add folds into the other; see scatterInto). */
  private accumulate(a: Var, b: Var): Var {
    const intoB = this.scatterInto.get(b);
    if (intoB) return intoB(a);
    const intoA = this.scatterInto.get(a);
    return intoA ? intoA(b) : this.add(a, b);
  }

  private record(inputs: (Var | null)[], outputs: Var[], vjp: Vjp): void {
    this.tape.push({ inputs, outputs, vjp, scope: this.currentScope });
  }

  /**
   * Reverse-mode gradient of `y` with respect to each of `wrt`, seeded with `dy` (default 1 for a
   * scalar / single-element `y`). Emits the backward ops into this builder. `into`: a tensor per
   * `wrt` that its gradient is added to (gradient accumulation), each contribution as it is made:
   * inside checkpointed blocks the sums are ordered with the blocks (see checkpoint), so no
   * block's gradient waits, materialised, for the end of the backward.
   */
  grad(y: Var, wrt: Var[], dy?: Var, opts: { into?: readonly Var[] } = {}): Var[] {
    if (!dy) {
      if (!y.shape.every((d) => d === 1))
        throw new GraphError(`grad: ${y.name} ${fmtShape(y.shape)} is not a scalar; pass dy`);
      dy = y.rank === 0 ? this.const(1, y.dtype) : this.reshape(this.const([1], y.dtype), y.shape);
    } else if (!shapeEq(dy.shape, y.shape)) {
      throw new GraphError(`grad: dy ${fmtShape(dy.shape)} does not match y ${fmtShape(y.shape)}`);
    }
    this.ckptDone = [];
    const seeds = new Map([[y.id, dy]]);
    opts.into?.forEach((a, i) => {
      if (!shapeEq(a.shape, wrt[i].shape))
        throw new GraphError(`grad: into ${a.name} ${fmtShape(a.shape)} does not match ${wrt[i].name}`);
      seeds.set(wrt[i].id, a);
    });
    const grads = this.backprop(this.tape.slice(), seeds, wrt);
    this.ckptDone = [];
    return wrt.map((w, i) => grads[i] ?? this.scope('grad', () => this.zerosLike(w)));
  }

  /** Reverse pass over `tape` from the seeds (value id → gradient); one gradient per `wrt` (null where none reaches it). */
  private backprop(tape: readonly TapeEntry[], seeds: Map<number, Var>, wrt: readonly Var[]): (Var | null)[] {
    // which values depend on wrt
    const needs = new Set<number>(wrt.map((w) => w.id));
    for (const e of tape) {
      if (e.inputs.some((i) => i && needs.has(i.id))) for (const o of e.outputs) needs.add(o.id);
    }
    const grads = new Map<number, Var>(seeds);
    for (let k = tape.length - 1; k >= 0; k--) {
      const e = tape[k];
      const gOut = e.outputs.map((o) => grads.get(o.id) ?? null);
      if (gOut.every((g) => g === null)) continue;
      const wanted = e.inputs.map((i) => !!i && isFloatType(i.dtype) && needs.has(i.id));
      if (!wanted.some((w) => w)) continue;
      const saved = this.scopes;
      this.scopes = ['grad', ...(e.scope ? [e.scope] : [])];
      try {
        const gIn = e.vjp(gOut, wanted);
        e.inputs.forEach((inp, i) => {
          const g = gIn[i];
          if (!inp || !g || !wanted[i]) return;
          if (!shapeEq(g.shape, inp.shape))
            throw new GraphError(
              `internal: gradient for ${inp.name} has shape ${fmtShape(g.shape)}, expected ${fmtShape(inp.shape)}`,
            );
          const prev = grads.get(inp.id);
          const sum = prev ? this.accumulate(prev, g) : g;
          grads.set(inp.id, sum);
          // the next checkpoint's recomputation waits for the sum, not only for g (see checkpoint)
          if (prev) this.ckptDone = this.ckptDone.map((d) => (d === g ? sum : d));
        });
      } finally {
        this.scopes = saved;
      }
    }
    return wrt.map((w) => grads.get(w.id) ?? null);
  }

  /**
   * Activation (gradient) checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear
   * Memory Cost"; torch.utils.checkpoint): `ys = fn(xs)`, but the backward keeps only `xs` and runs
   * `fn` again inside the backward on copies of them, then differentiates that copy, so none of
   * fn's intermediates live from the forward to the backward. `fn` must take every value it reads
   * that needs a gradient (weights included) through `xs`; anything else it reads is a constant to
   * it (no gradient flows there), and reading a graph input that is not in `xs` is an error.
   *
   * The copies are x + z, z = 0·(g₀ + Σ d₀) (g₀ one element of an incoming output gradient, d₀ one
   * element of each gradient the previously differentiated checkpoint returned), exactly x for
   * finite values. The dependency on g₀ makes the recomputation part of the backward, so
   * onnxruntime can neither run it early (keeping its results alive after all) nor merge it with
   * the forward's identical nodes by common-subexpression elimination. The one on d₀ makes the
   * previous block's weight gradients finish before this block recomputes: onnxruntime's default
   * order runs the chain of input gradients first and every weight-gradient Gemm (nothing later
   * needs it) at the end, which would keep every block's recomputed activations alive until then.
   * `fn` may be called twice; it must not have side effects beyond building nodes.
   */
  checkpoint(xs: Var[], fn: (xs: Var[]) => Var[]): Var[] {
    const start = this.tape.length;
    const ys = fn(xs);
    const inner = this.tape.splice(start);
    const produced = new Set<number>(inner.flatMap((e) => e.outputs.map((o) => o.id)));
    const taken = new Set<number>(xs.map((x) => x.id));
    const graphInputs = new Set<number>(this.inputs.map((v) => v.id));
    for (const e of inner) {
      for (const i of e.inputs) {
        if (i && isFloatType(i.dtype) && graphInputs.has(i.id) && !taken.has(i.id) && !produced.has(i.id))
          throw new GraphError(
            `checkpoint (scope "${this.currentScope}"): fn reads graph input ${i.name} that is not among its inputs, so it would get no gradient`,
          );
      }
    }
    this.customVjp(xs, ys, (gOut, wanted) => {
      const g0 = gOut.find((g) => g !== null)!;
      // z = 0·(g₀[0] + Σ d[0]) as a scalar: a data dependency on the backward that adds nothing
      const first = (v: Var): Var => {
        const one = this.emit1(
          'Slice',
          [
            this.emit1('Reshape', [v, this.const([-1], 'int64')], { dtype: v.dtype, shape: [this.unknownDim()] }),
            this.const([0], 'int64'),
            this.const([1], 'int64'),
          ],
          { dtype: v.dtype, shape: [1] },
        );
        const s = this.emit1('Squeeze', [one, this.const([0], 'int64')], { dtype: v.dtype, shape: [] });
        return v.dtype === g0.dtype
          ? s
          : this.emit1('Cast', [s], { dtype: g0.dtype, shape: [] }, { to: ONNX_DTYPE[g0.dtype] });
      };
      const deps = [g0, ...this.ckptDone].map(first);
      const sum = deps.slice(1).reduce((a, d) => this.emit1('Add', [a, d], { dtype: g0.dtype, shape: [] }), deps[0]);
      const z = this.emit1('Mul', [sum, this.const(0, g0.dtype)], { dtype: g0.dtype, shape: [] });
      const zOf = new Map<DType, Var>([[g0.dtype, z]]);
      const copies = xs.map((x) => {
        if (!isFloatType(x.dtype)) return x;
        let zx = zOf.get(x.dtype);
        if (!zx) {
          zx = this.emit1('Cast', [z], { dtype: x.dtype, shape: [] }, { to: ONNX_DTYPE[x.dtype] });
          zOf.set(x.dtype, zx);
        }
        return this.emit1('Add', [x, zx], { dtype: x.dtype, shape: x.shape }, {});
      });
      const start2 = this.tape.length;
      const ys2 = this.scope('recompute', () => fn(copies));
      const inner2 = this.tape.splice(start2);
      if (ys2.length !== ys.length)
        throw new GraphError(`checkpoint: fn returned ${ys2.length} values on recomputation, ${ys.length} before`);
      const seeds = new Map<number, Var>();
      ys2.forEach((y, i) => {
        const g = gOut[i];
        if (g) seeds.set(y.id, seeds.has(y.id) ? this.add(seeds.get(y.id)!, g) : g);
      });
      const want = copies.filter((_, i) => wanted[i]);
      const got = this.backprop(inner2, seeds, want);
      this.ckptDone = got.filter((g): g is Var => g !== null && isFloatType(g.dtype));
      let k = 0;
      return copies.map((_, i) => (wanted[i] ? got[k++] : null));
    });
    return ys;
  }

  // ───────────────────────────── serialisation ─────────────────────────────

  toModelProto(): onnxProto.onnx.ModelProto {
    if (this.outputs.length === 0) throw new GraphError(`graph "${this.name}" has no outputs`);
    // prune nodes that do not contribute to any output
    const live = new Set(this.outputs.map((o) => o.name));
    const keep: NodeRec[] = [];
    for (let i = this.nodes.length - 1; i >= 0; i--) {
      const n = this.nodes[i];
      if (n.outputs.some((o) => live.has(o))) {
        keep.push(n);
        for (const x of n.inputs) if (x) live.add(x);
      }
    }
    keep.reverse();
    const nodes = foldOutputAliases(keep, new Set(this.outputs.map((o) => o.name)));
    const vi = (v: Var) => ({
      name: v.name,
      type: {
        tensorType: {
          elemType: ONNX_DTYPE[v.dtype],
          shape: {
            dim: v.shape.map((d) => (typeof d === 'number' ? { dimValue: d } : isKnown(d) ? { dimParam: d } : {})),
          },
        },
      },
    });
    const graph = {
      name: this.name,
      node: nodes.map((n) => ({
        opType: n.opType,
        name: n.name,
        input: n.inputs,
        output: n.outputs,
        domain: n.domain || undefined,
        attribute: Object.entries(n.attrs).map(([k, v]) => encodeAttr(k, v)),
      })),
      initializer: this.inits.filter((t) => live.has(t.name)).map((t) => tensorProto(t.name, t.data, t.shape, t.dtype)),
      input: this.inputs.map(vi),
      output: this.outputs.map(vi),
    };
    const opsetImport = [
      { domain: '', version: this.opset },
      ...[...this.extraDomains].map(([domain, version]) => ({ domain, version })),
    ];
    return onnx.ModelProto.create({ irVersion: 8, producerName: 'rlstream', opsetImport, graph });
  }

  toBytes(): Uint8Array {
    return onnx.ModelProto.encode(this.toModelProto()).finish();
  }
}

/**
 * Drops output()'s naming Identities where the value is another node's only-named output: that
 * node then writes the graph output itself, so a caller's pre-allocated output buffer receives it
 * without an intermediate tensor and a copy (onnxruntime keeps an Identity whose output is a graph
 * output). A value that is a graph input, an initializer, already an output or named twice keeps
 * its Identity.
 */
function foldOutputAliases(nodes: readonly NodeRec[], outputs: ReadonlySet<string>): NodeRec[] {
  const produced = new Set(nodes.flatMap((n) => n.outputs));
  const rename = new Map<string, string>();
  for (const n of nodes) {
    const v = n.inputs[0];
    if (n.outputAlias && produced.has(v) && !outputs.has(v) && !rename.has(v)) rename.set(v, n.outputs[0]);
  }
  const to = (x: string) => rename.get(x) ?? x;
  return nodes
    .filter((n) => !(n.outputAlias && rename.get(n.inputs[0]) === n.outputs[0]))
    .map((n) => ({ ...n, inputs: n.inputs.map(to), outputs: n.outputs.map(to) }));
}

function tensorProto(name: string, data: TensorData, shape: number[], dtype: DType): onnxProto.onnx.ITensorProto {
  const bytes = new Uint8Array(data.buffer, data.byteOffset, data.length * BYTES[dtype]);
  return { name, dims: shape, dataType: ONNX_DTYPE[dtype], rawData: Uint8Array.from(bytes) };
}

function encodeAttr(name: string, v: AttrValue): onnxProto.onnx.IAttributeProto {
  const T = onnx.AttributeProto.AttributeType;
  if (v instanceof FloatAttr)
    return Array.isArray(v.v) ? { name, type: T.FLOATS, floats: v.v } : { name, type: T.FLOAT, f: v.v };
  if (v instanceof TensorAttr) return { name, type: T.TENSOR, t: tensorProto('', v.data, v.shape, v.dtype) };
  if (typeof v === 'string') return { name, type: T.STRING, s: new TextEncoder().encode(v) };
  if (typeof v === 'number') return Number.isInteger(v) ? { name, type: T.INT, i: v } : { name, type: T.FLOAT, f: v };
  if (v.length > 0 && typeof v[0] === 'string')
    return { name, type: T.STRINGS, strings: (v as string[]).map((s) => new TextEncoder().encode(s)) };
  const nums = v as number[];
  return nums.every(Number.isInteger) ? { name, type: T.INTS, ints: nums } : { name, type: T.FLOATS, floats: nums };
}
