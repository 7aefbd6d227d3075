"""Renders chat templates the way transformers' apply_chat_template does (jinja2 sandbox,
trim_blocks, lstrip_blocks, raise_exception) for the tests' Python reference. Reads a JSON list of
{template, messages, add_generation_prompt, context} from stdin, writes a JSON list of strings."""
import json
import sys

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
out = []
for case in json.load(sys.stdin):
    t = env.from_string(case["template"])
    out.append(t.render(messages=case["messages"], add_generation_prompt=case["add_generation_prompt"], **case["context"]))
json.dump(out, sys.stdout)
