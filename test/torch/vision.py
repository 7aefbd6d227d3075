"""A vision-language policy's per-token log-probs with images, and optionally AdamW steps on the
cross-entropy loss (every weight, vision tower included).

inputs (safetensors): input_ids I64 [B, T], attention_mask [B, T], loss_mask F32 [B, T-1],
image.<i> U8 [H, W, 3] (the batch's images in row-major order of their placeholders).
--suppress: token ids with a -1e9 logit bias (rlstream masks a VLM's vision tokens everywhere).
out (safetensors): logprobs F32 [B, T-1] (before any step); with --steps, the final weights too.
Prints {"losses": [...], "grad_norms": [...]}.
"""
import json

import torch

from _common import emit, parser, setup
from llama_ref import AdamW, AdamWConfig, ce_loss, forward, lm_head, load_params, load_safetensors, positions_from_mask, save_safetensors
from vision_ref import VisionConfig, load_vision_params, place_images, vision_tower

p = parser(__doc__)
p.add_argument("--weights", required=True)
p.add_argument("--inputs", required=True)
p.add_argument("--out", required=True)
p.add_argument("--suppress", default="")
p.add_argument("--steps", type=int, default=0)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--weight-decay", type=float, default=0.0)
p.add_argument("--max-grad-norm", type=float, default=1.0)
args = p.parse_args()
cfg = setup(args)
with open(args.config) as f:
    vc = VisionConfig.from_config(json.load(f))
params = load_params(cfg, args.weights, requires_grad=True)
params.update(load_vision_params(args.weights, requires_grad=True))
inp = load_safetensors(args.inputs)
ids = inp["input_ids"].long()
mask = inp["attention_mask"].long()
lmask = inp["loss_mask"].float()
images = [inp[f"image.{i}"] for i in range(sum(1 for k in inp if k.startswith("image.")))]
bias = torch.zeros(cfg.vocab_size)
for t in filter(None, args.suppress.split(",")):
    bias[int(t)] = -1e9


def logprobs() -> torch.Tensor:
    emb = place_images(params["model.embed_tokens.weight"][ids], ids, vc.image_token_id, vision_tower(params, vc, images))
    h, _ = forward(params, cfg, ids, positions_from_mask(mask), mask.bool(), inputs_embeds=emb)
    logp = torch.log_softmax(lm_head(params, cfg, h[:, :-1]) + bias, dim=-1)
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)


out = {}
with torch.no_grad():
    out["logprobs"] = logprobs()
opt = AdamW(params, AdamWConfig(lr=args.lr, weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm))
losses, norms = [], []
for _ in range(args.steps):
    loss = ce_loss(logprobs(), lmask)
    loss.backward()
    losses.append(float(loss))
    norms.append(opt.step())
if args.steps:
    out.update({k: v.detach() for k, v in params.items()})
save_safetensors(args.out, out)
emit({"losses": losses, "grad_norms": norms})
