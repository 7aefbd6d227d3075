/**
 * Where the policy and critic graphs run (no onnxruntime import, so config can name them):
 * onnxruntime's CPU EP; its CUDA EP (a separate download, see runtime.ts); or its WebGPU EP,
 * which onnxruntime-node 1.30 ships in its binaries and which reaches a GPU through Dawn (Vulkan
 * on Linux: the GPU driver's Vulkan ICD and the loader libvulkan.so.1). Nodes an EP cannot run
 * fall back to the CPU EP inside the session.
 */
export const DEVICES = ['cpu', 'cuda', 'webgpu'] as const;
export type Device = (typeof DEVICES)[number];
