/** ONNX graph builder with autodiff, composite NN ops, and onnxruntime helpers. */
export * from './builder.ts';
export * from './nn.ts';
export * from './runtime.ts';
