"""Compares rlstream's Qwen-VL outputs (prep.ts) with transformers' classes: python3 check.py DIR (README.md)."""
import json, os, numpy as np, torch
from PIL import Image
import transformers
from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration, Qwen2VLForConditionalGeneration
import sys
root = sys.argv[1]
OUT = os.environ.get('OUT', root)
ours = json.load(open(os.path.join(root, 'ours.json')))
res = {'transformers': transformers.__version__, 'torch': torch.__version__}
for d, cls in [('qvl25', Qwen2_5_VLForConditionalGeneration), ('qvl2', Qwen2VLForConditionalGeneration)]:
  try:
    dp = os.path.join(root, d)
    model, info = cls.from_pretrained(dp, dtype=torch.float32, output_loading_info=True)
    model.eval()
    res[f'{d}/loading_info'] = {k: list(v)[:10] for k, v in info.items() if v}
    t = json.load(open(os.path.join(root, f'text_{d}.json')))
    full = torch.tensor([t['prompt_ids'] + t['response_ids']])
    with torch.no_grad():
      lg = model(input_ids=full, attention_mask=torch.ones_like(full)).logits.float()
    P = len(t['prompt_ids'])
    lp = torch.log_softmax(lg[0, P - 1:-1], -1).gather(-1, torch.tensor(t['response_ids'])[:, None])[:, 0]
    res[f'{d}/text'] = {'logprob_max_abs_diff': float((lp - torch.tensor(t['logprobs'])).abs().max())}
    for fast in [False, True]:
      proc = AutoProcessor.from_pretrained(dp, use_fast=fast)
      for im in ['fit.png', 'resize.png']:
        o = ours[f'{d}/{im}']; r = {}
        msgs = [{'role': 'user', 'content': [{'type': 'image'}, {'type': 'text', 'text': 'Describe the picture.'}]}]
        text = proc.apply_chat_template(msgs, add_generation_prompt=True)
        inp = proc(text=[text], images=[Image.open(os.path.join(root, im)).convert('RGB')], return_tensors='pt')
        P = inp['input_ids'].shape[1]; R = len(o['response_ids'])
        r['prompt_ids_equal'] = inp['input_ids'][0].tolist() == o['prompt_ids']
        pv = inp['pixel_values'].float(); N = pv.shape[0]
        mine = torch.from_numpy(np.fromfile(os.path.join(root, f'{d}_{im}.f32'), dtype=np.float32)).reshape(N, 3, 4, 4)
        r['pixel_max_abs_diff'] = float((pv.reshape(N, 3, 2, 4, 4)[:, :, 0] - mine).abs().max())
        f = dict(inp)
        f['input_ids'] = torch.cat([inp['input_ids'], torch.tensor([o['response_ids']])], 1)
        for k, v in inp.items():
          if k != 'input_ids' and v.dim() == 2 and v.shape[1] == P:
            f[k] = torch.cat([v, (torch.ones if k == 'attention_mask' else torch.zeros)(1, R, dtype=v.dtype)], 1)
        with torch.no_grad():
          lg = model(**f).logits.float()
          lp = torch.log_softmax(lg[0, P - 1:-1], -1).gather(-1, torch.tensor(o['response_ids'])[:, None])[:, 0]
          r['logprob_max_abs_diff'] = float((lp - torch.tensor(o['logprobs'])).abs().max())
          g = model.generate(**inp, max_new_tokens=12, do_sample=False)
          r['greedy_equal'] = g[0, P:].tolist() == o['response_ids']
        res[f'{d}/{im}/processor={"fast" if fast else "slow"}'] = r
  except Exception:
    import traceback; res[f'{d}/error'] = traceback.format_exc()[-2000:]
json.dump(res, open(os.path.join(OUT, 'result4.json'), 'w'), indent=1)
print(json.dumps(res, indent=1))
