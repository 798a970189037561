#!/usr/bin/env python3
"""Reference splits for Kimi-K2's pre-tokenizer, and with --gpt-4o for tiktoken's o200k pattern
(gpt-oss; llama.cpp's "gpt-4o"), for tests/model/tokenizer_pretok_test.cc.

Runs Moonshot's pattern (tokenization_kimi.py of the released model), or o200k's (the same
without the Han rules, and with [\r\n/]* after a punctuation run), with Python's backtracking
`re` engine, each \\p{..} class and the `&&` intersections spelled out for the characters of the
input: general categories from unicodedata, the Han script from Debian's unicode-data package
(/usr/share/unicode/Scripts.txt), \\s as the White_Space property.

Usage: scripts/pretok_oracle_kimi.py [--gpt-4o] CASES.json  (a JSON list of strings; prints one
[text, [pieces...]] JSON line per string)
"""
import json
import os
import re
import sys
import unicodedata

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_unicode_tables import WHITE_SPACE as WHITE_SPACE_CPS, han_ranges  # noqa: E402

WHITE_SPACE = set(map(chr, WHITE_SPACE_CPS))
HAN = han_ranges()


def is_han(c):
    return any(lo <= ord(c) <= hi for lo, hi in HAN)


def cls(chars, neg=False, extra=""):
    """A character class of `chars` (plus the escaped `extra`); an empty one never matches."""
    body = extra + "".join(re.escape(c) for c in sorted(set(chars)))
    if neg:
        return "[^" + body + "]" if body else "[\\s\\S]"
    return "[" + body + "]" if body else "(?:(?!x)x)"


def split(text, o200k=False):
    cs = set(text)
    cat = unicodedata.category
    han = [] if o200k else [c for c in cs if is_han(c)]
    upper = [c for c in cs if (cat(c) in ("Lu", "Lt", "Lm", "Lo") or cat(c)[0] == "M") and c not in han]
    lower = [c for c in cs if (cat(c) in ("Ll", "Lm", "Lo") or cat(c)[0] == "M") and c not in han]
    letter_number = [c for c in cs if cat(c)[0] in "LN"]
    number = [c for c in cs if cat(c)[0] == "N"]
    ws = [c for c in cs if c in WHITE_SPACE]
    contraction = "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    prefix = cls(letter_number, True, "\\r\\n") + "?"
    pattern = "|".join(([] if o200k else [cls(han) + "+"]) + [
        prefix + cls(upper) + "*" + cls(lower) + "+" + contraction,
        prefix + cls(upper) + "+" + cls(lower) + "*" + contraction,
        cls(number) + "{1,3}",
        " ?" + cls(ws + letter_number, True) + ("+[\\r\\n/]*" if o200k else "+[\\r\\n]*"),
        cls(ws) + "*[\\r\\n]+",
        cls(ws) + "+(?!" + cls(ws, True) + ")",
        cls(ws) + "+",
    ])
    out, pos = [], 0
    for m in re.finditer(pattern, text):
        if m.start() > pos:
            out.append(text[pos:m.start()])
        if m.end() > m.start():
            out.append(m.group())
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


def main():
    o200k = sys.argv[1] == "--gpt-4o"
    with open(sys.argv[-1], encoding="utf-8") as f:
        for text in json.load(f):
            print(json.dumps([text, split(text, o200k)], ensure_ascii=True))


if __name__ == "__main__":
    main()
