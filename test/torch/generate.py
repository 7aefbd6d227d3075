"""KV-cache generation with given uniforms (sampling parity with lib/model/sample.ts).

inputs (safetensors): prompt_ids I64 [B, P] left-padded, prompt_mask I64 [B, P], uniforms F32
[B, N], eos_ids I64 [E] (optional). out (safetensors): tokens I64 [B, N], logprobs F32 [B, N],
lengths I64 [B].
"""
from _common import emit, parser, setup
from llama_ref import generate, load_params, load_safetensors, save_safetensors

p = parser(__doc__)
p.add_argument("--weights", required=True)
p.add_argument("--inputs", required=True)
p.add_argument("--out", required=True)
p.add_argument("--temperature", type=float, default=1.0)
p.add_argument("--top-k", type=int, default=0)
p.add_argument("--top-p", type=float, default=1.0)
args = p.parse_args()
cfg = setup(args)
params = load_params(cfg, args.weights)
inp = load_safetensors(args.inputs)
u = inp["uniforms"].float()
eos = [int(x) for x in inp["eos_ids"].tolist()] if "eos_ids" in inp else []
toks, lps, lengths = generate(params, cfg, inp["prompt_ids"].long(), inp["prompt_mask"].long(), u.shape[1], u,
                              args.temperature, eos, top_k=args.top_k, top_p=args.top_p)
save_safetensors(args.out, {"tokens": toks, "logprobs": lps, "lengths": lengths})
emit({"ok": True})
