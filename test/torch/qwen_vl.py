"""Qwen2-VL / Qwen2.5-VL reference driver (qwen_vl_ref.py) on a Hugging Face model directory.

inputs (safetensors): input_ids I64 [B, T], attention_mask I64 [B, T], loss_mask F32 [B, T-1],
image.<i> U8 [H, W, 3] (the batch's images in order of their placeholders), greedy_prompt I64 [1, P]
with greedy_images (indices into image.<i>, I64 [K]) for --greedy N.
--suppress: ids with a -1e9 logit bias (rlstream never emits a VLM's vision tokens).
out (safetensors): pixel_values, features, logprobs [B, T-1], greedy I64 [N], grad.<name> of the
token-mean cross-entropy over loss_mask (with --grads).
"""
import torch

from _common import emit
from llama_ref import load_safetensors, save_safetensors
from qwen_vl_ref import QwenVL
import argparse

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--model", required=True)
p.add_argument("--inputs", required=True)
p.add_argument("--out", required=True)
p.add_argument("--suppress", default="")
p.add_argument("--greedy", type=int, default=0)
p.add_argument("--grads", action="store_true")
args = p.parse_args()
torch.set_num_threads(1)
m = QwenVL(args.model, requires_grad=args.grads)
inp = load_safetensors(args.inputs)
ids, mask = inp["input_ids"].long(), inp["attention_mask"].long()
images = [inp[f"image.{i}"] for i in range(sum(1 for k in inp if k.startswith("image.")))]
V = m.p["model.embed_tokens.weight"].shape[0]
bias = torch.zeros(V)
for t in filter(None, args.suppress.split(",")):
    bias[int(t)] = -1e9

logits, pix, feats = m.forward(ids, mask, images)
logp = torch.log_softmax(logits[:, :-1] + bias, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
out = {"pixel_values": pix.detach(), "features": feats.detach(), "logprobs": logp.detach()}
if args.grads:
    lm = inp["loss_mask"].float()
    loss = -(logp * lm).sum() / lm.sum()
    loss.backward()
    out.update({f"grad.{k}": v.grad for k, v in m.p.items() if v.grad is not None})
if args.greedy:
    with torch.no_grad():
        seq = inp["greedy_prompt"].long()
        imgs = [images[int(i)] for i in inp["greedy_images"].tolist()]
        new = []
        for _ in range(args.greedy):
            lg, _, _ = m.forward(seq, torch.ones_like(seq), imgs)
            nxt = int(torch.argmax(lg[0, -1] + bias))
            new.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], 1)
    out["greedy"] = torch.tensor(new, dtype=torch.long)
save_safetensors(args.out, out)
emit({"ok": True})
