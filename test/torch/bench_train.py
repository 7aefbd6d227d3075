"""Time one PPO training step: forward, token log-probs, clipped loss, backward, global-norm
clip and AdamW, on B random rows of length T. Prints {"ms": median ms per step, ...}.

Uses the stock torch.optim.AdamW (foreach) and clip_grad_norm_, i.e. what a torch trainer runs;
llama_ref.AdamW is the same update written out for the parity tests.
"""
import resource
import time

import torch

from _common import emit, parser, setup
from llama_ref import load_params, ppo_clip_loss, random_params, token_logprobs

p = parser(__doc__)
p.add_argument("--weights", default="", help="safetensors (default: seeded random weights)")
p.add_argument("--batch", type=int, required=True)
p.add_argument("--seq", type=int, required=True)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--iters", type=int, default=5)
args = p.parse_args()
cfg = setup(args)
params = load_params(cfg, args.weights, requires_grad=True) if args.weights else {k: v.requires_grad_(True) for k, v in random_params(cfg, 0).items()}
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=g)
lmask = torch.ones(args.batch, args.seq - 1)
lmask[:, : args.seq // 4] = 0  # prompt part
adv = torch.randn(args.batch, args.seq - 1, generator=g)
with torch.no_grad():
    old, _ = token_logprobs(params, cfg, ids)
plist = list(params.values())
opt = torch.optim.AdamW(plist, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=True)
times, cpu = [], []
for i in range(args.warmup + args.iters):
    t0, c0 = time.perf_counter(), time.process_time()
    lp, _ = token_logprobs(params, cfg, ids)
    loss = ppo_clip_loss(lp, old, adv, lmask)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(plist, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    dt = time.perf_counter() - t0
    if i >= args.warmup:
        times.append(dt)
        cpu.append(time.process_time() - c0)
times.sort()
med = times[len(times) // 2]
emit({"ms": med * 1e3, "cpu_ms": sorted(cpu)[len(cpu) // 2] * 1e3, "threads": torch.get_num_threads(), "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "times_ms": [t * 1e3 for t in times]})
