"""One long-lived worker of rlstream's Python reward pool (lib/reward-fns/python-pool.ts).

Standard library only; Python 3.8 or newer. Started as

    python python_worker.py <module.py> <function name> <form>

it imports the module once, then reads one JSON message per line on stdin,
{"id": n, "timeout": seconds, "kwargs": {...}, "items": [reward input, ...]}, and answers one
JSON line per message, {"id": n, "results": [...]}, one result per item:
{"reward": float, "metrics": {...}} or {"error": "Type: message", "where": "file:line in fn"}.

The protocol owns the process's original stdout; the user's print() goes to stderr (fd 1 is
redirected there), which the pool forwards to the console.

Forms (how the function is called and what it returns):
  verl               compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
                     -> number | bool | {"score": number, ...}
  easyr1_batch       fn([{"response", "response_length", "ground_truth", ...}, ...], **kwargs)
                     -> [{"overall": number, ...}, ...]  (one call per message)
  easyr1_sequential  fn({"response", "response_length", "ground_truth", ...}, **kwargs)
                     -> {"overall": number, ...}
  mtrl               fn(data_dict, **kwargs) -> (reward, {"metric": value, ...})
"""

import importlib.util
import json
import math
import os
import signal
import sys
import time
import traceback

FORMS = ("verl", "easyr1_batch", "easyr1_sequential", "mtrl")


class CallTimeout(BaseException):
    """Raised inside the user's function when its call runs past the time limit (a BaseException
    so that the function's own `except Exception` does not swallow it)."""


def last_frame(tb):
    """'file:line in function' of the traceback's innermost frame outside this file, or ''."""
    frames = [f for f in traceback.extract_tb(tb) if os.path.abspath(f.filename) != os.path.abspath(__file__)]
    if not frames:
        return ""
    f = frames[-1]
    return "%s:%d in %s" % (os.path.basename(f.filename), f.lineno, f.name)


def describe(e):
    msg = str(e)
    return "%s: %s" % (type(e).__name__, msg) if msg else type(e).__name__


def plain(v):
    """A JSON-safe copy of a metric value: numpy scalars and arrays via .item()/.tolist()."""
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    for attr in ("item", "tolist"):
        f = getattr(v, attr, None)
        if callable(f):
            try:
                return plain(f())
            except Exception:
                pass
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    return str(v)


def number(v, what):
    v = plain(v)
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    if isinstance(v, (int, float)):
        v = float(v)
        if not math.isfinite(v):
            raise ValueError("%s is %r; a reward is a finite number" % (what, v))
        return v
    raise ValueError("%s is %s; expected a number" % (what, json.dumps(v)[:120]))


def metrics_of(d, skip):
    out = {}
    for k, v in d.items():
        if k in skip:
            continue
        v = plain(v)
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError("metric %r is %r; a metric is a finite number, a boolean or a string" % (k, v))
        if v is None:
            continue
        out[str(k)] = v if isinstance(v, (bool, int, float, str)) else json.dumps(v)
    return out


def normalise(form, out):
    """The function's return value -> {"reward", "metrics"}; raises ValueError saying what was wrong."""
    if form == "verl":
        if isinstance(out, dict):
            if "score" not in out:
                raise ValueError("compute_score returned a dict without 'score' (keys: %s)" % ", ".join(map(str, out)))
            return {"reward": number(out["score"], "score"), "metrics": metrics_of(out, ("score",))}
        return {"reward": number(out, "the returned value"), "metrics": {}}
    if form in ("easyr1_batch", "easyr1_sequential"):
        if not isinstance(out, dict) or "overall" not in out:
            raise ValueError("expected a dict with 'overall' (EasyR1's RewardScore), got %s" % type(out).__name__)
        return {"reward": number(out["overall"], "overall"), "metrics": metrics_of(out, ())}
    # mtrl
    if isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[1], dict):
        return {"reward": number(out[0], "the reward"), "metrics": metrics_of(out[1], ())}
    if isinstance(out, (tuple, list)):
        raise ValueError("expected a (reward, metrics) tuple, got a %s of %d" % (type(out).__name__, len(out)))
    return {"reward": number(out, "the returned value"), "metrics": {}}


def inputs(form, cols, n):
    """The argument tuple of each call in the form's shape, from the message's columns."""
    resp, truth = cols["response"], cols["ground_truth"]
    ds = cols.get("data_source") or [""] * n
    extra = cols.get("extra_info") or [None] * n
    images = cols.get("images") or [None] * n
    if form == "verl":
        out = []
        for i in range(n):
            e = extra[i] if extra[i] is not None else {}
            if images[i]:
                e = dict(e)
                e.setdefault("images", images[i])
            out.append((ds[i], resp[i], truth[i], e))
        return out
    prompt = cols.get("prompt") or [""] * n
    length = cols.get("response_length") or [0] * n
    out = []
    for i in range(n):
        d = {
            "response": resp[i],
            "response_length": length[i],
            "ground_truth": truth[i],
            "prompt": prompt[i],
            "data_source": ds[i],
            "extra_info": extra[i] if extra[i] is not None else {},
        }
        if images[i]:
            d["images"] = images[i]
        out.append((d,))
    return out


class Watch:
    """Per-call time limit: one repeating alarm per message (not two system calls per call);
    the handler raises CallTimeout in the call that has run past `timeout`."""

    def __init__(self):
        self.active = False
        self.start = 0.0
        self.timeout = 0.0
        signal.signal(signal.SIGALRM, self._tick)

    def _tick(self, signum, frame):
        if self.active and time.monotonic() - self.start > self.timeout:
            self.active = False
            raise CallTimeout()

    def arm(self, timeout):
        self.timeout = timeout
        if timeout > 0:
            period = max(0.005, min(0.25, timeout / 10))
            signal.setitimer(signal.ITIMER_REAL, period, period)

    def disarm(self):
        self.active = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def failure(e, tb, timeout):
    if isinstance(e, CallTimeout):
        return {"error": "did not return within reward.timeout_s = %g s" % timeout, "where": last_frame(tb), "timeout": True}
    return {"error": describe(e), "where": last_frame(tb)}


def run_message(form, fn, msg, watch):
    """{"rewards": [...], "metrics": [...], "errors": {index: failure}} for one message."""
    timeout = float(msg.get("timeout") or 0)
    kwargs = msg.get("kwargs") or {}
    n = int(msg["n"])
    args = inputs(form, msg["cols"], n)
    rewards = [None] * n
    metrics = [None] * n
    errors = {}
    watch.arm(timeout)
    try:
        if form == "easyr1_batch":
            try:
                watch.start = time.monotonic()
                watch.active = True
                outs = fn([a[0] for a in args], **kwargs)
                watch.active = False
                if not isinstance(outs, (list, tuple)) or len(outs) != n:
                    got = "%d results" % len(outs) if isinstance(outs, (list, tuple)) else type(outs).__name__
                    raise ValueError("the batch function returned %s for %d inputs" % (got, n))
            except BaseException as e:
                watch.active = False
                if isinstance(e, (KeyboardInterrupt, SystemExit)):
                    raise
                r = failure(e, sys.exc_info()[2], timeout)
                return {"rewards": rewards, "errors": {str(i): r for i in range(n)}}
        else:
            outs = [None] * n
            for i in range(n):
                try:
                    watch.start = time.monotonic()
                    watch.active = True
                    outs[i] = fn(*args[i], **kwargs)
                    watch.active = False
                except BaseException as e:
                    watch.active = False
                    if isinstance(e, (KeyboardInterrupt, SystemExit)):
                        raise
                    errors[str(i)] = failure(e, sys.exc_info()[2], timeout)
    finally:
        watch.disarm()
    for i in range(n):
        if str(i) in errors:
            continue
        try:
            r = normalise(form, outs[i])
        except ValueError as e:
            errors[str(i)] = {"error": describe(e), "where": ""}
            continue
        rewards[i] = r["reward"]
        if r["metrics"]:
            metrics[i] = r["metrics"]
    out = {"rewards": rewards, "errors": errors}
    if any(m is not None for m in metrics):
        out["metrics"] = metrics
    return out


def load(path, name):
    """The module's function, or (None, one line saying why not)."""
    spec = importlib.util.spec_from_file_location("rlstream_reward_module", path)
    if spec is None or spec.loader is None:
        return None, "cannot import %s (not a Python source file?)" % path
    module = importlib.util.module_from_spec(spec)
    sys.modules["rlstream_reward_module"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        where = last_frame(sys.exc_info()[2])
        return None, "importing %s raised %s%s" % (path, describe(e), " (at %s)" % where if where else "")
    fn = getattr(module, name, None)
    if not callable(fn):
        have = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                      and getattr(v, "__module__", None) == "rlstream_reward_module")
        return None, "%s has no function %r (it defines: %s); set reward.reward_fn_name" % (
            path, name, ", ".join(have) if have else "no functions")
    return fn, None


def main():
    path, name, form = sys.argv[1], sys.argv[2], sys.argv[3]
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", newline="\n")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj):
        proto.write(json.dumps(obj, ensure_ascii=False, allow_nan=False))
        proto.write("\n")
        proto.flush()

    if form not in FORMS:
        send({"loadError": "unknown form %r (valid: %s)" % (form, ", ".join(FORMS))})
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    fn, err = load(path, name)
    if err is not None:
        send({"loadError": err})
        return
    watch = Watch()
    send({"ready": True, "python": sys.version.split()[0], "executable": sys.executable})
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        out = run_message(form, fn, msg, watch)
        out["id"] = msg["id"]
        send(out)


if __name__ == "__main__":
    main()
