/** Model engine: config, parameters, initialisation, the Llama graph and vision tower, checkpoints, tokenizers, training. */
export * from './config.ts';
export * from './params.ts';
export * from './init.ts';
export * from './llama.ts';
export * from './safetensors.ts';
export * from './checkpoint.ts';
export * from './tokenizer.ts';
export * from './loss.ts';
export * from './train-graph.ts';
export * from './train.ts';
export * from './session-cache.ts';
export * from './vision.ts';
export * from './lora.ts';
