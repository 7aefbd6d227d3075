"""PyTorch reference of the DiT velocity predictor (lib/image/dit.ts) and the image policy losses
(lib/image/flow-graph.ts): flow matching, Flow-GRPO's per-step clipped ratio with KL, DiffusionNFT;
the RL losses with classifier-free guidance (loss cfgScale w) train v_null + w·(v_c − v_null).

--config: JSON of the DitConfig; --loss: JSON of the ImageLossConfig.
inputs (safetensors): the parameters by name, x [B, C, S, S], t [B], cls I64 [B] (the velocity),
and the loss's batch inputs (flow-graph.ts imageLossInputs).
out (safetensors): velocity, log_probs (flow_grpo) and grad.<param> of the loss.
Prints {"loss": float}.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from llama_ref import load_safetensors, save_safetensors  # noqa: E402

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--config", required=True)
p.add_argument("--loss", required=True)
p.add_argument("--inputs", required=True)
p.add_argument("--out", required=True)
args = p.parse_args()
torch.set_num_threads(1)
cfg = json.loads(args.config)
loss_cfg = json.loads(args.loss)
inp = load_safetensors(args.inputs)
names = [k for k in inp if k not in ("x", "t", "cls") and not k.startswith("b.")]
params = {k: inp[k].clone().double().requires_grad_(True) for k in names}
batch = {k[2:]: inp[k] for k in inp if k.startswith("b.")}


def lin(h, n, P):
    return h @ P[n + ".weight"].T + P[n + ".bias"]


def velocity(P, x, t, cls):
    B = x.shape[0]
    ps, C, S, D, H = cfg["patchSize"], cfg["channels"], cfg["imageSize"], cfg["hidden"], cfg["heads"]
    G = S // ps
    N = G * G
    hd = D // H
    patches = x.reshape(B, C, G, ps, G, ps).permute(0, 2, 4, 1, 3, 5).reshape(B * N, C * ps * ps)
    h = lin(patches, "x_embed", P).reshape(B, N, D) + P["pos_embed"]
    half = cfg["timeFreqs"] // 2
    freqs = 1000 * torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float64) / half)
    a = t.double()[:, None] * freqs[None]
    tf = torch.cat([torch.cos(a), torch.sin(a)], 1)
    c = lin(F.silu(lin(tf, "t_embed.0", P)), "t_embed.2", P) + P["class_embed.weight"][cls]
    sc = F.silu(c)

    def ln(z):
        return F.layer_norm(z, (D,), eps=1e-6)

    def mod(z, shift, scale):
        return ln(z) * (1 + scale[:, None]) + shift[:, None]

    for i in range(cfg["depth"]):
        sh1, sc1, g1, sh2, sc2, g2 = lin(sc, f"blocks.{i}.ada", P).chunk(6, dim=1)
        hn = mod(h, sh1, sc1).reshape(B * N, D)
        qkv = lin(hn, f"blocks.{i}.qkv", P).reshape(B, N, 3, H, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1)
        o = (att @ v).permute(0, 2, 1, 3).reshape(B * N, D)
        h = h + g1[:, None] * lin(o, f"blocks.{i}.proj", P).reshape(B, N, D)
        hn = mod(h, sh2, sc2).reshape(B * N, D)
        m = lin(F.gelu(lin(hn, f"blocks.{i}.fc1", P)), f"blocks.{i}.fc2", P).reshape(B, N, D)
        h = h + g2[:, None] * m
    shift, scale = lin(sc, "final.ada", P).chunk(2, dim=1)
    out = lin(mod(h, shift, scale).reshape(B * N, D), "final.linear", P)
    return out.reshape(B, G, G, C, ps, ps).permute(0, 3, 1, 4, 2, 5).reshape(B, C, S, S)


def pix_mean(z):
    return z.mean(dim=(1, 2, 3))


out = {}
with torch.no_grad():
    out["velocity"] = velocity(params, inp["x"].double(), inp["t"].double(), inp["cls"].long()).float()

d = {k: v.double() for k, v in batch.items() if k != "cls"}
cls = batch["cls"].long()
name = loss_cfg["name"]
c4 = (lambda z: z[:, None, None, None])
guide = loss_cfg.get("cfgScale", 1)


def trained_velocity(x, t):
    vc = velocity(params, x, t, cls)
    if name == "flow_matching" or guide == 1:
        return vc
    vn = velocity(params, x, t, torch.full_like(cls, cfg["numClasses"]))
    return vn + guide * (vc - vn)


if name in ("flow_matching", "diffusion_nft"):
    x0, eps, t = d["x0"], d["noise"], d["t"]
    xt = (1 - c4(t)) * x0 + c4(t) * eps
    u = eps - x0
    vt = trained_velocity(xt, t)
    if name == "flow_matching":
        loss = pix_mean((vt - u) ** 2).mean()
    else:
        beta = loss_cfg.get("nftBeta", 1)
        v_old, r = d["v_old"], d["nft_r"]
        pos = pix_mean(((1 - beta) * v_old + beta * vt - u) ** 2)
        neg = pix_mean(((1 + beta) * v_old - beta * vt - u) ** 2)
        loss = (r * pos + (1 - r) * neg).mean()
else:
    x_t, x_next, t, s, sigma = d["x_t"], d["x_next"], d["t"], d["t_next"], d["sigma"]
    v = trained_velocity(x_t, t)
    dt = s - t
    mean = x_t * c4(1 + sigma**2 * dt / (2 * t)) + v * c4((1 + sigma**2 * (1 - t) / (2 * t)) * dt)
    std = c4(sigma * torch.sqrt(-dt))
    logp = pix_mean(-((x_next - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi))
    out["log_probs"] = logp.detach().float()
    ratio = torch.exp(logp - d["old_log_probs"])
    adv = d["advantages"]
    clipped = torch.clamp(ratio, 1 - loss_cfg.get("clipLow", 1e-4), 1 + loss_cfg.get("clipHigh", 1e-4))
    per = -torch.minimum(ratio * adv, clipped * adv)
    beta = loss_cfg.get("klCoef", 0)
    if beta > 0:
        per = per + beta * pix_mean((mean - d["ref_mean"]) ** 2) / (2 * std[:, 0, 0, 0] ** 2)
    loss = per.mean()
loss.backward()
for k, v in params.items():
    out["grad." + k] = v.grad.float()
save_safetensors(args.out, out)
print(json.dumps({"loss": float(loss)}))
