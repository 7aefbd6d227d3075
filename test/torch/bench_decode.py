"""Time KV-cache generation: prefill B prompts of length P, then N sampled tokens (no EOS).

Prints {"ms": median ms per generate call, "tokens_per_s": B*N / median seconds, ...}.
"""
import resource
import time

import torch

from _common import emit, parser, setup
from llama_ref import generate, load_params, random_params

p = parser(__doc__)
p.add_argument("--weights", default="", help="safetensors (default: seeded random weights)")
p.add_argument("--batch", type=int, required=True)
p.add_argument("--prompt-len", type=int, required=True)
p.add_argument("--new", type=int, required=True)
p.add_argument("--temperature", type=float, default=1.0)
p.add_argument("--warmup", type=int, default=1)
p.add_argument("--iters", type=int, default=3)
args = p.parse_args()
cfg = setup(args)
params = load_params(cfg, args.weights) if args.weights else random_params(cfg, 0)
g = torch.Generator().manual_seed(1)
prompts = torch.randint(0, cfg.vocab_size, (args.batch, args.prompt_len), generator=g)
mask = torch.ones_like(prompts)
u = torch.rand(args.batch, args.new, generator=g)
times, cpu = [], []
for i in range(args.warmup + args.iters):
    t0, c0 = time.perf_counter(), time.process_time()
    toks, _, lengths = generate(params, cfg, prompts, mask, args.new, u, args.temperature)
    dt = time.perf_counter() - t0
    if i >= args.warmup:
        times.append(dt)
        cpu.append(time.process_time() - c0)
    assert int(lengths.sum()) == args.batch * args.new
times.sort()
med = times[len(times) // 2]
emit({"ms": med * 1e3, "cpu_ms": sorted(cpu)[len(cpu) // 2] * 1e3, "tokens_per_s": args.batch * args.new / med, "threads": torch.get_num_threads(), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "times_ms": [t * 1e3 for t in times]})
