"""A verl-style math reward: the answer is the last \\boxed{...} in the response, compared with
the ground truth after LaTeX normalisation (and numerically when both are numbers or fractions).

    reward:
      reward_fn_path: examples/python-reward/math_boxed.py   # reward_fn_form: verl (default)

compute_score returns {"score": 1.0 or 0.0, "acc": bool, "pred": the extracted answer}; `score` is
the reward, the other keys are stored with the sample (acc as a metric, pred as text).
Standard library only.
"""

import re
from fractions import Fraction


def last_boxed(text):
    """The content of the last \\boxed{...} (or \\fbox{...}) with balanced braces, or None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        # "\\boxed 5": the token after a space
        m = re.match(r"\\boxed\s+([^\s$]+)", text[start:])
        return m.group(1) if m else None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def _fix_fracs(s):
    # \frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2}
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    return s


def normalise(s):
    s = s.strip()
    s = s.replace("\n", "").replace("\\!", "").replace("\\,", "").replace("\\;", "")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("\\%", "").replace("%", "")
    s = s.replace("$", "")
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\mbox\{\s*([^{}]*)\}", r"\1", s)
    # "x = 5" -> "5" (a single left-hand variable)
    m = re.fullmatch(r"\s*[a-zA-Z]\s*=\s*(.+)", s)
    if m:
        s = m.group(1)
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = _fix_fracs(s)
    s = s.replace(" ", "")
    s = s.rstrip(".")
    # 0.5 written .5; thousands separators
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if s.startswith("."):
        s = "0" + s
    if s.startswith("-."):
        s = "-0" + s[1:]
    if s == "0.5":
        s = "\\frac{1}{2}"
    return s


def as_number(s):
    """A normalised answer as an exact Fraction when it is an integer, decimal or \\frac{a}{b}."""
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
    if m:
        den = int(m.group(3))
        if den == 0:
            return None
        v = Fraction(int(m.group(2)), den)
        return -v if m.group(1) else v
    m = re.fullmatch(r"(-?)(\d+)/(\d+)", s)
    if m and int(m.group(3)) != 0:
        v = Fraction(int(m.group(2)), int(m.group(3)))
        return -v if m.group(1) else v
    if re.fullmatch(r"-?\d+(\.\d+)?", s):
        return Fraction(s)
    return None


def is_equiv(pred, truth):
    a, b = normalise(pred), normalise(truth)
    if a == b:
        return True
    x, y = as_number(a), as_number(b)
    return x is not None and y is not None and x == y


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    pred = last_boxed(solution_str)
    truth = last_boxed(ground_truth) or ground_truth
    correct = pred is not None and is_equiv(pred, truth)
    return {"score": 1.0 if correct else 0.0, "acc": correct, "pred": pred if pred is not None else ""}
