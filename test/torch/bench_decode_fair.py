"""Time KV-cache sampling of n responses per prompt, written as a fast eager PyTorch decoder would.

Each of the --prompts prompts (length P) is prefilled once and its cache expanded to its n rows;
the cache is preallocated [rows, Hkv, P + N, dh] per layer and each step's keys and values are
written in place; grouped-query attention reads the shared kv heads by reshaping the queries to
[rows, Hkv, H / Hkv, dh] (no repeat of k and v). Sampling is bench_decode.py's (inverse CDF of
softmax(logits / T), no EOS). Runs under torch.inference_mode().

Prints {"ms": median ms per generate call, "tokens_per_s": prompts*n*N / median seconds, ...}.
"""
import math
import resource
import time

import torch

from _common import emit, parser, setup
from llama_ref import forward, generate as reference_generate, lm_head, load_params, random_params, rms_norm, rope_cos_sin, rotate_half

p = parser(__doc__)
p.add_argument("--weights", default="", help="safetensors (default: seeded random weights)")
p.add_argument("--prompts", type=int, required=True)
p.add_argument("--n", type=int, required=True, help="responses per prompt")
p.add_argument("--prompt-len", type=int, required=True)
p.add_argument("--new", type=int, required=True)
p.add_argument("--temperature", type=float, default=1.0)
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--iters", type=int, default=3)
p.add_argument("--check", action="store_true",
               help="also sample with llama_ref.generate on the prompts repeated n times and fail unless the tokens are equal")
args = p.parse_args()
cfg = setup(args)
params = load_params(cfg, args.weights) if args.weights else random_params(cfg, 0)
H, Hkv, dh, L = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers
rep = H // Hkv


def generate(prompts: torch.Tensor, n: int, new: int, u: torch.Tensor) -> torch.Tensor:
    B0, P = prompts.shape
    rows, S = B0 * n, P + new
    h, kv = forward(params, cfg, prompts)  # one prefill per prompt
    K = [torch.empty(rows, Hkv, S, dh) for _ in range(L)]
    V = [torch.empty(rows, Hkv, S, dh) for _ in range(L)]
    for i, (k, v) in enumerate(kv):
        K[i][:, :, :P] = k.repeat_interleave(n, 0)
        V[i][:, :, :P] = v.repeat_interleave(n, 0)
    del kv
    logits = lm_head(params, cfg, h[:, -1]).repeat_interleave(n, 0)
    toks = torch.empty(rows, new, dtype=torch.long)
    scale = 1 / math.sqrt(dh)
    for t in range(new):
        z = logits / args.temperature
        cdf = torch.softmax(z, -1).cumsum(-1)
        tok = (cdf < u[:, t:t + 1] * cdf[:, -1:]).sum(-1).clamp(max=cfg.vocab_size - 1)
        toks[:, t] = tok
        if t + 1 == new:
            break
        pos = P + t
        cos, sin = rope_cos_sin(cfg, torch.full((rows, 1), pos))
        x = params["model.embed_tokens.weight"][tok][:, None]  # [rows, 1, D]
        for i in range(L):
            pre = f"model.layers.{i}."
            hn = rms_norm(x, params[pre + "input_layernorm.weight"], cfg.rms_norm_eps)
            q = hn @ params[pre + "self_attn.q_proj.weight"].t()
            k = hn @ params[pre + "self_attn.k_proj.weight"].t()
            v = hn @ params[pre + "self_attn.v_proj.weight"].t()
            if pre + "self_attn.q_proj.bias" in params:
                q = q + params[pre + "self_attn.q_proj.bias"]
                k = k + params[pre + "self_attn.k_proj.bias"]
                v = v + params[pre + "self_attn.v_proj.bias"]
            q = q.view(rows, 1, H, dh).transpose(1, 2)  # [rows, H, 1, dh]
            k = k.view(rows, 1, Hkv, dh).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            K[i][:, :, pos:pos + 1] = k * cos + rotate_half(k) * sin
            V[i][:, :, pos:pos + 1] = v.view(rows, 1, Hkv, dh).transpose(1, 2)
            qg = q.reshape(rows, Hkv, rep, dh)  # query head j reads kv head j // rep
            att = torch.softmax((qg @ K[i][:, :, :pos + 1].transpose(-1, -2)) * scale, -1) @ V[i][:, :, :pos + 1]
            x = x + att.reshape(rows, 1, H * dh) @ params[pre + "self_attn.o_proj.weight"].t()
            hn = rms_norm(x, params[pre + "post_attention_layernorm.weight"], cfg.rms_norm_eps)
            gate = hn @ params[pre + "mlp.gate_proj.weight"].t()
            up = hn @ params[pre + "mlp.up_proj.weight"].t()
            x = x + (torch.nn.functional.silu(gate) * up) @ params[pre + "mlp.down_proj.weight"].t()
        logits = lm_head(params, cfg, rms_norm(x, params["model.norm.weight"], cfg.rms_norm_eps)[:, 0])
    return toks


g = torch.Generator().manual_seed(1)
prompts = torch.randint(0, cfg.vocab_size, (args.prompts, args.prompt_len), generator=g)
u = torch.rand(args.prompts * args.n, args.new, generator=g)
times, cpu = [], []
with torch.inference_mode():
    for i in range(args.warmup + args.iters):
        t0, c0 = time.perf_counter(), time.process_time()
        toks = generate(prompts, args.n, args.new, u)
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(dt)
            cpu.append(time.process_time() - c0)
        assert toks.shape == (args.prompts * args.n, args.new)
rows = args.prompts * args.n
if args.check:
    with torch.inference_mode():
        ref, _, _ = reference_generate(params, cfg, prompts.repeat_interleave(args.n, 0),
                                       torch.ones(rows, args.prompt_len, dtype=torch.long), args.new, u, args.temperature)
    if not torch.equal(ref, toks):
        raise SystemExit(f"fair decode differs from llama_ref.generate at {int((ref != toks).sum())} of {ref.numel()} tokens")
times.sort()
med = times[len(times) // 2]
emit({"checked": args.check, "ms": med * 1e3, "cpu_ms": sorted(cpu)[len(cpu) // 2] * 1e3, "tokens_per_s": rows * args.new / med, "threads": torch.get_num_threads(), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "times_ms": [t * 1e3 for t in times]})
