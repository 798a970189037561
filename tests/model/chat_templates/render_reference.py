#!/usr/bin/env python3
"""Reference renderer for the chat-template tests.

This is the independent reference for tests/model/chat_template_test.cc: it
renders a Hugging Face chat template with Python's jinja2, set up the way
`transformers` sets it up (ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks and loop controls; its own tojson, raise_exception and
strftime_now), so that the C++ interpreter in model/chat_template.{h,cc} can be
checked against it.  transformers also registers its AssistantTracker
extension; GenerationTag stands in for it: {% generation %}...{% endgeneration %}
renders its body unchanged, as AssistantTracker does when no assistant mask is
asked for.

Usage: python3 render_reference.py TEMPLATE.jinja CONTEXTS.json [--now EPOCH_SECONDS]
       [--repeat N]  (also the median seconds of N renderings, for bench/chat_template_bench)

CONTEXTS.json is a JSON array of {"name": ..., "context": {...}}.  The template
is rendered once per context with template.render(**context); stdout gets one
JSON array with, per context in order, {"name": ..., "text": RENDERED} or
{"name": ..., "error": MESSAGE}.  strftime_now formats the fixed time --now
(UTC, default 1785067200) rather than the clock, so the output is reproducible.
"""
import argparse
import datetime
import json
import sys
import time

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox


class GenerationTag(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body)
        return call.set_lineno(lineno)

    def _body(self, caller):
        return caller()


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("template")
    parser.add_argument("contexts")
    parser.add_argument("--now", type=int, default=1785067200)
    parser.add_argument("--repeat", type=int, default=0,
                        help="also time each rendering: the median of this many, in seconds")
    args = parser.parse_args()

    now = datetime.datetime.fromtimestamp(args.now, tz=datetime.timezone.utc)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: now.strftime(fmt)

    with open(args.template, encoding="utf-8", newline="") as f:
        source = f.read()
    with open(args.contexts, encoding="utf-8") as f:
        contexts = json.load(f)

    try:
        template = env.from_string(source)
        compile_error = None
    except Exception as e:  # a template that does not compile
        template, compile_error = None, str(e)

    results = []
    for case in contexts:
        name = case["name"]
        if compile_error is not None:
            results.append({"name": name, "error": compile_error})
            continue
        try:
            results.append({"name": name, "text": template.render(**case["context"])})
        except Exception as e:  # TemplateError from raise_exception: str(e) is its message
            results.append({"name": name, "error": str(e)})
            continue
        if args.repeat > 0:  # for bench/chat_template_bench
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                template.render(**case["context"])
                times.append(time.perf_counter() - start)
            results[-1]["seconds"] = sorted(times)[len(times) // 2]

    sys.stdout.reconfigure(encoding="utf-8")
    print(json.dumps(results, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
