"""N AdamW steps (global-norm clipping first) on one batch; prints the loss before each step.

inputs as grads.py. Prints {"losses": [...], "grad_norms": [...]}; --out saves the final weights.
"""
from _common import emit, parser, setup
from llama_ref import AdamW, AdamWConfig, ce_loss, load_params, load_safetensors, ppo_clip_loss, save_safetensors, token_logprobs

p = parser(__doc__)
p.add_argument("--weights", required=True)
p.add_argument("--inputs", required=True)
p.add_argument("--loss", choices=["ppo", "ce"], required=True)
p.add_argument("--steps", type=int, default=3)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--beta1", type=float, default=0.9)
p.add_argument("--beta2", type=float, default=0.999)
p.add_argument("--eps", type=float, default=1e-8)
p.add_argument("--weight-decay", type=float, default=0.0)
p.add_argument("--max-grad-norm", type=float, default=1.0)
p.add_argument("--clip-eps", type=float, default=1e-6)
p.add_argument("--clip-low", type=float, default=0.2)
p.add_argument("--clip-high", type=float, default=0.2)
p.add_argument("--clip-c", type=float, default=3.0)
p.add_argument("--out", default="")
args = p.parse_args()
cfg = setup(args)
params = load_params(cfg, args.weights, requires_grad=True)
inp = load_safetensors(args.inputs)
ids = inp["input_ids"].long()
mask = inp["attention_mask"].long() if "attention_mask" in inp else None
lmask = inp["loss_mask"].float()
opt = AdamW(params, AdamWConfig(args.lr, args.beta1, args.beta2, args.eps, args.weight_decay, args.max_grad_norm, args.clip_eps))
losses, norms = [], []
for _ in range(args.steps):
    lp, _e = token_logprobs(params, cfg, ids, mask)
    if args.loss == "ppo":
        loss = ppo_clip_loss(lp, inp["old_logprobs"].float(), inp["advantages"].float(), lmask, args.clip_low, args.clip_high, args.clip_c)
    else:
        loss = ce_loss(lp, lmask)
    loss.backward()
    losses.append(float(loss))
    norms.append(opt.step())
if args.out:
    save_safetensors(args.out, {k: v.detach() for k, v in params.items()})
emit({"losses": losses, "grad_norms": norms})
