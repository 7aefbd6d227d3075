"""Per-token log-probs and entropy (and values with --value-head) of given token rows.

inputs (safetensors): input_ids I64 [B, T], optional attention_mask [B, T] (0 = padding, either
side). out (safetensors): logprobs, entropy F32 [B, T-1] (position t scores token t+1), or for a
value model (--value-head) values F32 [B, T].
"""
import torch

from _common import emit, parser, setup
from llama_ref import forward, load_params, load_safetensors, positions_from_mask, save_safetensors, token_logprobs, value_head

p = parser(__doc__)
p.add_argument("--weights", required=True)
p.add_argument("--inputs", required=True)
p.add_argument("--out", required=True)
p.add_argument("--temperature", type=float, default=1.0)
p.add_argument("--value-head", action="store_true")
args = p.parse_args()
cfg = setup(args)
params = load_params(cfg, args.weights, value_head=args.value_head)
inp = load_safetensors(args.inputs)
ids = inp["input_ids"].long()
mask = inp["attention_mask"].long() if "attention_mask" in inp else None
with torch.no_grad():
    if args.value_head:
        pos = positions_from_mask(mask) if mask is not None else None
        h, _ = forward(params, cfg, ids, pos, mask.bool() if mask is not None else None)
        out = {"values": value_head(params, h)}
    else:
        lp, ent = token_logprobs(params, cfg, ids, mask, args.temperature)
        out = {"logprobs": lp, "entropy": ent}
save_safetensors(args.out, out)
emit({"ok": True})
