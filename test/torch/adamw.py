"""N AdamW steps (global-norm clipping first) on one batch; prints the loss before each step.

inputs as grads.py. Prints {"losses": [...], "grad_norms": [...]}; --out saves the final weights.
--adapter FILE (LoRA, Hu et al. 2021): the base weights are frozen and the trained parameters are the
adapter tensors <module>.lora_A.weight [r, in] / .lora_B.weight [out, r] of FILE; each adapted module's
weight is W + (alpha / r)·B·A (the merged form, differentiated by autograd), and --out saves the adapters.
"""
import torch
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
p.add_argument("--adapter", default="")
p.add_argument("--lora-alpha", type=float, default=0.0)
args = p.parse_args()
cfg = setup(args)
params = load_params(cfg, args.weights, requires_grad=not args.adapter)
adapter = {k: v.to(torch.float32).clone().requires_grad_(True) for k, v in load_safetensors(args.adapter).items()} if args.adapter else {}


def effective() -> dict:
    """The weights the forward uses: the base, with W + (alpha / r)·B·A for every adapted module."""
    if not adapter:
        return params
    out = dict(params)
    for name, a in adapter.items():
        if name.endswith(".lora_A.weight"):
            mod = name[: -len(".lora_A.weight")]
            b = adapter[mod + ".lora_B.weight"]
            out[mod + ".weight"] = params[mod + ".weight"] + (args.lora_alpha / a.shape[0]) * (b @ a)
    return out


trained = adapter if adapter else params
inp = load_safetensors(args.inputs)
ids = inp["input_ids"].long()
mask = inp["attention_mask"].long() if "attention_mask" in inp else None
lmask = inp["loss_mask"].float()
opt = AdamW(trained, AdamWConfig(args.lr, args.beta1, args.beta2, args.eps, args.weight_decay, args.max_grad_norm, args.clip_eps))
losses, norms = [], []
for _ in range(args.steps):
    lp, _e = token_logprobs(effective(), cfg, ids, mask)
    if args.loss == "ppo":
        loss = ppo_clip_loss(lp, inp["old_logprobs"].float(), inp["advantages"].float(), lmask, args.clip_low, args.clip_high, args.clip_c)
    else:
        loss = ce_loss(lp, lmask)
    loss.backward()
    losses.append(float(loss))
    norms.append(opt.step())
if args.out:
    save_safetensors(args.out, {k: v.detach() for k, v in trained.items()})
emit({"losses": losses, "grad_norms": norms})
