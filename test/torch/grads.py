"""Loss and gradients of every weight for one batch.

inputs (safetensors): input_ids I64 [B, T], optional attention_mask [B, T], loss_mask F32 [B, T-1]
(which next-token positions count), and for --loss ppo: advantages, old_logprobs F32 [B, T-1].
out (safetensors): loss F32 [] and grad.<weight name> for every weight.
"""
import torch

from _common import emit, parser, setup
from llama_ref import ce_loss, load_params, load_safetensors, ppo_clip_loss, save_safetensors, token_logprobs

p = parser(__doc__)
p.add_argument("--weights", required=True)
p.add_argument("--inputs", required=True)
p.add_argument("--out", required=True)
p.add_argument("--loss", choices=["ppo", "ce"], required=True)
p.add_argument("--clip-low", type=float, default=0.2)
p.add_argument("--clip-high", type=float, default=0.2)
p.add_argument("--clip-c", type=float, default=3.0)
p.add_argument("--temperature", type=float, default=1.0)
args = p.parse_args()
cfg = setup(args)
params = load_params(cfg, args.weights, requires_grad=True)
inp = load_safetensors(args.inputs)
ids = inp["input_ids"].long()
mask = inp["attention_mask"].long() if "attention_mask" in inp else None
lmask = inp["loss_mask"].float()
lp, _ = token_logprobs(params, cfg, ids, mask, args.temperature)
if args.loss == "ppo":
    loss = ppo_clip_loss(lp, inp["old_logprobs"].float(), inp["advantages"].float(), lmask, args.clip_low, args.clip_high, args.clip_c)
else:
    loss = ce_loss(lp, lmask)
loss.backward()
out = {"loss": loss.detach().reshape([])}
for k, v in params.items():
    out["grad." + k] = v.grad if v.grad is not None else torch.zeros_like(v)
save_safetensors(args.out, out)
emit({"ok": True, "loss": float(loss)})
