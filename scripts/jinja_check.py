#!/usr/bin/env python3
"""The Jinja cases nerve's template engine (src/serve/jinja.c) is tested on, and what jinja2 gives them.

Each case is a template rendered with the variables below in transformers' environment (sandboxed,
trim_blocks, lstrip_blocks, loop controls, its tojson, raise_exception): its text, or, for the
error cases, that it fails (the message nerve must give holds the string beside it).
tests/test_jinja.c renders tests/jinja_cases.json with nerve's engine; this script checks that
file against jinja2 itself (needs python3-jinja2), or with --write makes it.

usage: jinja_check.py CASES.json [--write]"""
import json
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment


def env():
    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise ValueError(message)

    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    return e


MSGS = [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "Hi ünï"},
        {"role": "assistant", "content": "Hello!", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [True, None, 2.5]}}}]},
        {"role": "tool", "content": "42"}, {"role": "user", "content": "  bye  "}]
V = {"messages": MSGS, "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": True,
     "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
     "n": 7, "x": 2.5, "s": "Hello, World", "e": "", "l": [3, 1, 2], "d": {"b": 2, "a": 1}, "none": None}
T = [
 # whitespace rules
 "A\n{% if true %}\n  B\n{% endif %}\nC",
 "  {% if true %}x{% endif %}  \n{{ 'y' }}",
 "a  {%- if true -%}  b  {%- endif -%}  c",
 "a  {{- 'b' -}}  c\n",
 "{% for i in range(3) %}\n    {{ i }}\n{% endfor %}\n",
 "{%+ if true %}x{% endif %}\n  {%+ if true %}y{% endif +%}\nz",
 "{# comment #}\nA{#- c -#}  B\n  {# c2 #}\nC",
 "{% raw %}{{ not }}{% endraw %}|{%- raw -%}  {% x %}  {%- endraw %}|",
 "line1\r\n{% if true %}\r\nx\r\n{% endif %}\r\nend",
 # expressions
 "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}",
 "{{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] + [2, 3] }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 10 / 4 }}",
 "{{ n > 3 and n < 10 }} {{ not n }} {{ n == 7.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ none is none }} {{ e or 'empty' }} {{ s and 'yes' }}",
 "{{ 'in' if 'ell' in s else 'out' }} {{ 3 in l }} {{ 'a' in d }} {{ 'z' not in d }} {{ 'x' if false }}|",
 "{{ l }} {{ d }} {{ none }} {{ true }} {{ [1, 'a', none, 2.0, {'k': 'v'}] }} {{ (1, 2) }} {{ \"it's\" }} {{ ['it\\'s', \"q\\\"\"] }}",
 "{{ s[0] }}{{ s[-1] }}{{ s[1:4] }}{{ s[::-1] }}{{ l[1:] }}{{ l[:-1] }}{{ l[::2] }}{{ 'ünï'[1] }}{{ 'ünïcode'[1:3] }}{{ l[10] is defined }}",
 "{{ messages[0].content }}|{{ messages[0]['role'] }}|{{ messages[2].tool_calls[0].function.name }}|{{ messages[1].missing is defined }}|{{ d.a }}{{ d['b'] }}",
 "{{ 'a' 'b' }} {{ \"x\\ty\\n\" }} {{ '\\u00e9\\x41\\101' }} {{ 'back\\\\slash' }} {{ 'keep\\d' }}",
 # statements
 "{% set a = 1 %}{% if a == 1 %}one{% elif a == 2 %}two{% else %}other{% endif %}{% if false %}x{% elif true %}el{% endif %}",
 "{% set x = 'outer' %}{% for i in l %}{% set x = 'inner' %}{{ x }}{% endfor %}{{ x }}",
 "{% for i in [1, 2] %}{{ x is defined }}{% set x = i %}{% endfor %}|{% set y = 0 %}{% for i in [1, 2] %}{% set y = y + i %}{{ y }}{% endfor %}{{ y }}",
 "{% set ns = namespace(c=0, s='') %}{% for i in l %}{% set ns.c = ns.c + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.c }} {{ ns.s }}",
 "{% for i in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}",
 "{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'aé' %}[{{ c }}]{% endfor %}",
 "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}",
 "{% for m in messages if m.role == 'user' %}{{ loop.index }}/{{ loop.length }}:{{ m.content }};{% endfor %}",
 "{% for i in [] %}x{% else %}empty{% endfor %}{% for i in none or [] %}{% endfor %}",
 "{% set b %}block {{ n }}{% endset %}[{{ b }}]{% set t = (1, 2) %}{{ t[1] }}",
 "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }}",
 "{% macro rec(k) %}{% if k > 0 %}{{ k }}{{ rec(k - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}",
 "{% macro m() %}{{ n }}{% endmacro %}{% set n = 8 %}{{ m() }}",
 # call blocks, filter blocks, with
 "{% macro m(x) %}[{{ x }}:{{ caller() }}]{% endmacro %}{% call m(1) %}body{% endcall %}",
 "{% macro m(x) %}[{% for i in range(x) %}{{ caller(i) }}{% endfor %}]{% endmacro %}{% call(v) m(3) %}<{{ v }}>{% endcall %}",
 "{% set y = 7 %}{% macro m() %}{{ caller() }}{% endmacro %}{% for q in [1, 2] %}{% call m() %}{{ q }}{{ y }}{% endcall %}{% endfor %}",
 "{% macro m() %}{{ caller is defined }}{% endmacro %}{{ m() }}|{% call m() %}x{% endcall %}",
 "{% macro m() %}{{ caller(b=3) }}{{ caller() }}{% endmacro %}{% call(a, b=2) m() %}[{{ a }}{{ b }}]{% endcall %}",
 "{% set ns = namespace(c=0) %}{% macro m() %}{{ caller() }}{% endmacro %}{% call m() %}{% set ns.c = 5 %}{% set z = 1 %}{% endcall %}{{ ns.c }}{{ z }}",
 "{% macro outer() %}({{ caller() }}){% endmacro %}{% macro inner() %}<{{ caller() }}>{% endmacro %}{% call outer() %}{% call inner() %}{{ n }}{% endcall %}{% endcall %}",
 "{% filter upper %}hello {{ s }}{% endfilter %}",
 "{% filter trim | upper %}  hi  {% endfilter %}|",
 "{% filter replace('a', 'b') %}banana{% endfilter %}",
 "{% filter upper %}{% set q = 'a' %}{{ q }}{% filter lower %}B{% endfilter %}{% endfilter %}[{{ q }}]",
 "{% set a = 5 %}{% with a = 1, b = a %}{{ a }},{{ b }}{% endwith %}{{ a }}",
 "{% with %}{% set x = 3 %}{{ x }}{% endwith %}[{{ x }}]",
 "{% for m in messages %}{% with r = m.role %}{% if r == 'tool' %}{% break %}{% endif %}{{ r }} {% endwith %}{% endfor %}",
 "{% for i in [1, 2, 3] %}{% filter upper %}a{{ i }}{% if i == 2 %}{% break %}{% endif %}b{% endfilter %}|{% endfor %}",
 "{% for i in [1, 2, 3] %}{% filter upper %}a{{ i }}{% if i == 2 %}{% continue %}{% endif %}b{% endfilter %}|{% endfor %}",
 "{% macro inner() %}[{{ caller() }}]{% endmacro %}{% macro outer() %}{% call inner() %}{{ caller is defined }}{% endcall %}{% endmacro %}{% call outer() %}X{% endcall %}",
 # filters
 "{{ '  pad ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ s | upper }}|{{ s | lower }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}",
 "{{ l | length }} {{ s | length }} {{ 'ünï' | length }} {{ d | count }} {{ undefined_thing | length }} {{ l | first }} {{ l | last }} {{ l | sort }} {{ l | sort(reverse=true) }}",
 "{{ l | join(', ') }}|{{ l | join }}|{{ messages | map(attribute='role') | join(',') }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
 "{{ messages | rejectattr('role', 'in', ['system', 'tool']) | map(attribute='role') | list }}|{{ l | select('odd') | list }}|{{ l | reject('even') | list }}",
 "{{ messages | selectattr('tool_calls', 'defined') | list | length }}|{{ messages | selectattr('tool_calls') | list | length }}",
 "{{ missing | default('dflt') }} {{ e | default('dflt') }} {{ e | default('dflt', true) }} {{ none | d('x') }}",
 "{{ d | tojson }} {{ l | tojson }} {{ tools | tojson }} {{ 'q\"\\\\\\n\\t\\u0001é' | tojson }} {{ none | tojson }} {{ 2.5 | tojson }}",
 "{{ tools | tojson(indent=2) }}\n{{ d | tojson(indent=4) }}\n{{ [] | tojson(indent=2) }}{{ {} | tojson(indent=2) }}{{ d | tojson(sort_keys=true) }}{{ d | tojson(separators=(',', ':')) }}",
 "{{ d | items | list }} {{ d | dictsort }} {{ l | reverse | list }} {{ 'abc' | reverse }} {{ [3, 1, 3, 2] | unique | list }} {{ l | min }} {{ l | max }} {{ l | sum }}",
 "{{ 'a-b-c' | replace('-', '+') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 3.7 | int }} {{ '42' | int }} {{ 'x' | int }} {{ '2.5' | float }} {{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }}",
 "{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a b  c' | wordcount }}|{{ n | string }}{{ l | string }}|{{ '<&>' | e }}|{{ 'x' | safe }}",
 "{{ ['B', 'a', 'C'] | sort }} {{ ['B', 'a', 'C'] | sort(case_sensitive=true) }} {{ messages | sort(attribute='role') | map(attribute='role') | join(',') }}",
 # tests
 "{{ n is odd }} {{ n is even }} {{ n is divisibleby 7 }} {{ n is number }} {{ x is float }} {{ n is integer }} {{ true is boolean }} {{ s is string }} {{ d is mapping }} {{ l is iterable }} {{ l is sequence }}",
 "{{ none is none }} {{ missing is undefined }} {{ n is defined }} {{ false is false }} {{ true is true }} {{ 1 is true }} {{ n is eq 7 }} {{ n is ne 7 }} {{ n is gt 3 }} {{ n is lt 3 }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 2 is in l }} {{ n is not none }}",
 # string methods
 "{{ s.strip() }}|{{ '  x  '.lstrip() }}|{{ '  x  '.rstrip() }}|{{ 'xyx'.strip('x') }}|{{ s.split(', ') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ s.startswith('Hell') }}|{{ s.endswith(('x', 'ld')) }}",
 "{{ s.upper() }}|{{ s.lower() }}|{{ s.replace('l', 'L') }}|{{ s.find('o') }}|{{ s.count('l') }}|{{ '-'.join(['a', 'b']) }}|{{ 'a\\nb'.splitlines() }}|{{ '12'.isdigit() }}|{{ s.title() }}|{{ 'ünï-x'.find('x') }}",
 "{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}",
 "{% set parts = messages[0].content.split(' ') %}{{ parts[-1] }} {{ messages[4].content | trim }}",
 # HF-style chat template shapes
 "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] | trim + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] | trim + eos_token }}{% endif %}{% endfor %}",
 "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n        {{- 'alt' }}\n    {%- endif %}\n    {{- '<|' + message['role'] + '|>\\n' + message['content'] | trim + '\\n' }}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|assistant|>\\n' }}\n{%- endif %}\n",
 "{%- for message in messages %}\n  {%- if message.tool_calls %}\n    {%- for tool_call in message.tool_calls %}\n      {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}\n<tool_call>\n{\"name\": \"{{ tool_call.name }}\", \"arguments\": {{ tool_call.arguments | tojson }}}\n</tool_call>\n    {%- endfor %}\n  {%- endif %}\n{%- endfor %}",
 "{%- set today = 'x' -%}\n{%- if tools is not none -%}\n{%- for t in tools %}\n{{- t | tojson(indent=4) }}\n{{- \"\\n\\n\" }}\n{%- endfor %}\n{%- endif %}",
 # what the first review of the engine found
 "{{ {'a': {'b': 1}} | tojson }}|{{ {'k': [1, {'z': 2}]}['k'][1]['z'] }}|{% set d2 = {'x': {'y': 1}} %}{{ d2.x.y }}",
 "{{ 3 > 2 > 1 }} {{ 1 < 2 < 2 }} {{ 1 == 1 != 2 }} {{ 'a' in 'abc' in 'xabcx' }} {{ 1 in nothing }} {{ 'q' not in nothing }}",
 "{{ 0 is sameas false }} {{ none is sameas none }} {{ l is sameas l }} {{ true is sameas true }} {{ 1 is sameas 1.0 }}",
 "{{ 'é«x' | tojson(true) }} {{ {'k': '😀'} | tojson(ensure_ascii=true) }} {{ d | tojson(false, 2) }} {{ l | tojson(indent=1) }}",
 "{{ ' a b  '.split(none, 1) }} {{ ' a  b c '.split(maxsplit=1) }} {{ '\u00a0x\u3000' | trim }}|{{ '\u2028 y \u0085'.strip() }}|{{ 'a\u00a0b'.split() }}",
 "{{ 'aaa'.rfind('aa') }} {{ 'aaa'.find('aa') }} {{ 'aaa'.count('aa') }} {{ 'abc'.find('') }} {{ 'abc'.rfind('') }} {{ 'abc'.count('') }} {{ 'a-é-b'.rfind('-') }}",
 "{{ [1, 2, 3][1::9223372036854775807] }} {{ 'abc'[::-9223372036854775807] }} {{ '' * 9223372036854775807 }}|{{ [] * 9223372036854775807 }}",
 "{{ range(100000) | reverse | max }} {{ range(100000) | reverse | sort | first }} {{ range(10, 0, -3) | list }} {{ range(0, 10, 4) | list }}",
 "{% set s = 'a' * 8000000 %}{{ s.count('a' * 4000000 ~ 'b') }} {{ (s ~ 'b').find('ab') }}",
 "{{ [3, 1, 2] | sort(true) }} {{ ['b', 'A', 'a', 'B'] | sort }} {{ [{'n': 2, 'k': 'x'}, {'n': 1, 'k': 'y'}, {'n': 2, 'k': 'z'}] | sort(attribute='n') | map(attribute='k') | join }}",
 "{{ [1, 3, 3, 2] | max }} {{ ['b', 'B'] | max }} {{ ['b', 'B'] | min }} {{ {'b': 1, 'A': 2, 'a': 3} | dictsort }} {{ {'b': 1, 'a': 2} | dictsort(reverse=true) }}",
 "{% set ns = namespace(d={}) %}{% for i in range(40) %}{% set ns.d = dict(ns.d, k=i) %}{% endfor %}{% set big = {'k0': 0, 'k1': 1, 'k2': 2, 'k3': 3, 'k4': 4, 'k5': 5, 'k6': 6, 'k7': 7, 'k8': 8, 'k9': 9, 'k10': 10, 'k11': 11, 'k12': 12, 'k13': 13, 'k14': 14, 'k15': 15, 'k16': 16, 'k17': 17, 'k10': 'again'} %}{{ big.k10 }} {{ big | length }} {{ big.k17 }} {{ 'k16' in big }} {{ big.k99 is defined }}",
 "{% set d = {0: 'zero', 512: 'half', 1.5: 'f', none: 'n', true: 't'} %}{{ d[512] }} {{ d }} {{ d[1] }} {{ d[1.0] }} {{ d.get(0) }} {{ d.get(7, 'no') }} {{ 512 in d }} {{ 2 in d }} {{ '512' in d }} {{ d | tojson }} {{ d | length }} {{ d[none] }}",
 "{% for k, v in {2: 'b', 1.0: 'a', 'x': 'c'}.items() %}{{ k }}:{{ v }};{% endfor %} {{ {2: 'b', 1: 'a'} | dictsort }} {{ {1: 2} == {1.0: 2} }} {{ {1: 'i', true: 'b'} }} {{ {'1': 's', 1: 'i'} | list }}",
 "{{ 3 | round }} {{ 3.7 | round }} {{ 2.5 | round }} {{ -2.5 | round }} {{ 2.345 | round(2) }} {{ 7 | round(method='floor') }} {{ 1234 | round(-2) }} {{ true | round }}",
 "{{ 'abc'.startswith('b', 1) }} {{ 'abc'.startswith('a', 1) }} {{ 'abc'.endswith('b', 0, 2) }} {{ 'abc'.endswith('c', -1) }} {{ 'héllo'.startswith('l', 2, 4) }} {{ 'abc'.startswith(('x', 'b'), 1) }} {{ 'abc'.startswith('', 5) }} {{ 'abc'.startswith('a', 2, 1) }}",
 "{{ 'a\nb\r\nc\rd'.splitlines() }} {{ 'a\nb\r\nc\n'.splitlines(true) }} {{ 'x\u2028y\x0bz'.splitlines() }} {{ ''.splitlines() }} {{ '\n'.splitlines(keepends=true) }}",
 "{{ 'ff' | int(base=16) }} {{ '0x1f' | int(0, 16) }} {{ '0b101' | int(0, 0) }} {{ ' 1_000 ' | int }} {{ '1.5' | int }} {{ 'zz' | int(7) }} {{ '-12' | int }} {{ '1__0' | int(3) }} {{ '077' | int(5, 0) }} {{ '0o17' | int(base=8) }} {{ 'ff' | int(base=40) }} {{ {1: 2} | tojson(sort_keys=true) }}",
 "{{ (1,) + (2,) }} {{ (1, 2) + () }} {{ [1] + [2] }} {{ ((1,) + (2, 3)) | length }}",
 "{{ 50001 | round(-5) }} {{ 50001.0 | round(-5) }} {{ 150 | round(-2) }} {{ 250 | round(-2) }} {{ -250 | round(-2) }} {{ 12345.678 | round(-2) }} {{ 12345.678 | round(-2, 'floor') }} {{ 7 | round(-1, 'ceil') }} {{ 5 | round(-20) }}",
 "{{ '0x1A' | int }} {{ '0x1p3' | int }} {{ ' 1_0.5 ' | int }} {{ 'nan' | int(3) }} {{ '1e3' | int }} {{ '-2.7' | int }} {{ '1__0.5' | int }}",
 "{{ [{0: 'a'}, {0: 'b'}] | map(attribute='0') | list }} {{ [{'0': 'a'}] | map(attribute='0') | select('defined') | list }} {{ [[5, 6]] | map(attribute='1') | list }} {{ {'a': 1}[[1]] is defined }} {{ {'a': 1}[{}] is defined }}",
]
ERR = [
 ("{{ raise_exception('Conversation roles must alternate') }}", "Conversation roles must alternate"),
 ("{% if %}", None), ("{% for x in %}{% endfor %}", None), ("{% if true %}unclosed", "endif"), ("{{ 'unterminated }}", None),
 ("{% foo %}", "unknown tag"), ("{{ missing.attr }}", "undefined"), ("{{ 1 + 'a' }}", "unsupported"), ("{{ 1 / 0 }}", "division"),
 ("{{ x | nosuchfilter }}", "nosuchfilter"), ("{{ x is nosuchtest }}", "nosuchtest"), ("{{ l.append(1) }}", "immutable"),
 ("{% set d.a = 1 %}", "namespace"), ("{{ undefined_fn() }}", "undefined"),
 ("{% endfor %}", None), ("{{ }}", None),
 ("{% macro m() %}{{ caller() }}{% endmacro %}{{ m() }}", "undefined"), ("{% call m() %}{% endcall %}", "undefined"),
 ("{% macro m() %}{{ caller(1, 2) }}{% endmacro %}{% call(a) m() %}{% endcall %}", "argument"), ("{% call n %}{% endcall %}", "macro"),
 ("{% macro inner() %}[{{ caller() }}]{% endmacro %}{% macro outer() %}{% call inner() %}{{ caller() }}{% endcall %}{% endmacro %}{% call outer() %}X{% endcall %}", "undefined"),
 ("{% filter nosuch %}x{% endfilter %}", "nosuch"), ("{% with a %}{% endwith %}", None), ("{% filter upper %}x", "endfilter"),
 ("{% for a, b in [1] %}{% endfor %}", "unpack"),
 ("{{ [1] + (2,) }}", "concatenate"), ("{{ {[1]: 2} }}", "key"), ("{{ {1: 2, 'a': 3} | tojson(sort_keys=true) }}", "sort_keys"), ("{{ none | tojson }}{{ missing | tojson }}", "JSON"),
]

# what nerve refuses that jinja2 would run (for long, or at length): its limits on work, nesting and size
LIMITS = [
 ("{% for i in range(100000000) %}{% endfor %}", "range"), ("{% macro r() %}{{ r() }}{% endmacro %}{{ r() }}", "deep"),
 ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "steps"),
 ("{{ 'x' * 100000000 }}", "16 MB"), ("{{ 9223372036854775807 + 1 }}", "overflow"), ("{{ 9223372036854775807 | round(-1) }}", "overflow"),
 ("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "16 MB"),
 ("{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}", "nested"),
 ("{{ x" + ".a" * 3000 + " }}", "nested"), ("{{ 1" + " ~ 1" * 3000 + " }}", "nested"), ("{{ 'x'" + " | trim" * 3000 + " }}", "nested"),
 ("{% set ns = namespace(a=0, b=0) %}{% for i in range(2000) %}{% set ns.a = [ns.a] %}{% set ns.b = [ns.b, 0] %}{% endfor %}{{ ns.a < ns.b }}", "nested"),
 ("{% set s = 'a' * 16000000 %}{% for i in range(100000) %}{% if s | length %}{% endif %}{% endfor %}", "steps"),
 ("{{ range(100000) | unique | list | length }}", "steps"),
 ("{{ " + "(" * 300 + "1" + ")" * 300 + " }}", "nested"),
]


def cases():
    e = env()
    out = []
    for t in T:
        out.append({"template": t, "expected": e.from_string(t).render(**V)})
    for t, message in ERR:
        try:
            e.from_string(t).render(**V)
            raise SystemExit(f"jinja_check: jinja2 renders an error case: {t!r}")
        except SystemExit:
            raise
        except Exception:  # the error jinja2 gives is its own; nerve's message is checked by the test
            pass
        out.append({"template": t, "error": message or ""})
    out += [{"template": t, "error": message, "limit": True} for t, message in LIMITS]
    return {"variables": V, "cases": out}


def main():
    path = sys.argv[1]
    made = cases()
    if "--write" in sys.argv[2:]:
        json.dump(made, open(path, "w"), ensure_ascii=False, indent=1)
        print(f"jinja_check: wrote {len(made['cases'])} cases")
        return
    kept = json.load(open(path))
    same = sum(1 for a, b in zip(made["cases"], kept["cases"]) if a == b)
    ok = same == len(made["cases"]) == len(kept["cases"]) and made["variables"] == kept["variables"]
    print(f"jinja_check: {same}/{len(kept['cases'])} cases as jinja2 gives them")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
