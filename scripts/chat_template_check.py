#!/usr/bin/env python3
"""nerve's chat templates against their Jinja forms, as transformers runs them.

For each template, `nerve export --chat-template T` writes a Hugging Face folder whose
tokenizer_config.json carries the template's Jinja text; a `nerve serve --chat-template T` answers
POST /apply-template with the prompt it would feed the model. Every conversation below is rendered
both ways (Jinja with transformers' environment: sandboxed, trim_blocks, lstrip_blocks, its tojson)
and the texts must be equal. Needs python3-jinja2.

usage: chat_template_check.py NERVE_BIN MODEL TOKENIZER WORK_DIR [DUMP.json]
Prints one line per template and exits 1 on any difference. DUMP.json gets every case (template
text, variables, nerve's prompt) for another Jinja engine to render (scripts/hf/chat_templates.mjs:
transformers.js's)."""
import datetime
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATES = ["plain", "chatml", "llama2", "llama3", "deepseek", "phi3", "gemma", "granite", "mistral", "phi4-mini", "phi4", "olmo2",
             "smollm3"]

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city, «now»",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                                                "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
# what json.dumps and Python's repr (SmolLM3's `tool | string`) write differently: quotes, escapes,
# characters Python does not print as they are, booleans, None, floats
ODD = {"type": "function", "function": {
    "name": "odd_one", "description": "it's \"quoted\", back\\slash, tab\there, line\nbreak, nbsp\u00a0, zwsp\u200b, "
                                      "soft\u00adhyphen, bell\u0007, del\u007f, \u2028, emoji \U0001F600, \u00e9",
    "parameters": {"type": "object", "properties": {
        "n": {"type": "number", "minimum": 0.5, "maximum": 1e-05, "default": 3, "examples": [1e16, 0.0001, -2.5, 123456.789]},
        "flag": {"type": "boolean", "default": True}, "none": {"default": None},
        "s": {"type": "string", "enum": ["it's", "say \"hi\"", "both ' and \"", ""]}}, "required": []}}}


def call(name, args, cid="c1"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


# (messages, extra request fields)
CASES = [
    ([{"role": "user", "content": "Hello"}], {}),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}], {}),
    ([{"role": "developer", "content": "  Spaces around  \n"}, {"role": "user", "content": "\tTabbed\n"}], {}),
    ([{"role": "user", "content": "A"}, {"role": "assistant", "content": "B"}, {"role": "user", "content": "C"}], {}),
    ([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}], {}),
    ([{"role": "system", "content": "s1"}, {"role": "system", "content": "s2"}, {"role": "user", "content": "u"}], {}),
    ([{"role": "system", "content": ""}, {"role": "system", "content": "later"}, {"role": "user", "content": "u"}], {}),
    ([{"role": "user", "content": "ends with an answer"}, {"role": "assistant", "content": "the answer"}], {}),
    ([{"role": "user", "content": [{"type": "text", "text": "parts "}, {"type": "text", "text": "joined"}]}], {}),
    ([{"role": "user", "content": "Unicode: žluťoučký kůň, 日本語, emoji \U0001F600"}], {}),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "content": "<think>hmm</think>visible"},
      {"role": "user", "content": "y"}], {}),
    ([{"role": "user", "content": "quotes \" and \\ backslash {{ not jinja }} {% raw %}"}], {}),
    ([{"role": "user", "content": "think less"}], {"chat_template_kwargs": {"enable_thinking": False}}),
    # SmolLM3's switches in the system message, and an answer that opens with line breaks
    ([{"role": "system", "content": "Be brief. /no_think"}, {"role": "user", "content": "A"},
      {"role": "assistant", "content": "\n\nB"}, {"role": "user", "content": "C"}], {}),
    ([{"role": "system", "content": "/system_override Only this. /think"}, {"role": "user", "content": "A"}], {}),
    ([{"role": "user", "content": "Weather in Paris?"}], {"tools": [WEATHER]}),
    ([{"role": "system", "content": "You help."}, {"role": "user", "content": "Weather?"}], {"tools": [WEATHER, TIME]}),
    ([{"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": None, "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}")]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 21}"}], {"tools": [WEATHER]}),
    ([{"role": "user", "content": "Both?"},
      {"role": "assistant", "content": "Checking.",
       "tool_calls": [call("get_weather", "{\"city\": \"Rome\"}"), call("get_time", "{}", "c2")]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
      {"role": "tool", "tool_call_id": "c2", "content": "noon"},
      {"role": "assistant", "content": "Sunny at noon."}, {"role": "user", "content": "Thanks"}],
     {"tools": [WEATHER, TIME]}),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
                                         "tool_calls": [call("get_time", "{}")]},
      {"role": "function", "content": "12:00"}], {}),
    ([{"role": "tool", "content": "a result first"}, {"role": "user", "content": "then a question"}], {}),
    ([{"role": "user", "content": "Odd?"}], {"tools": [ODD, TIME]}),
]


def jinja_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    # transformers' global (SmolLM3's template dates its system turn); the server's clock is this one
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def main():
    nerve, model, tok, work = sys.argv[1:5]
    dump = sys.argv[5] if len(sys.argv) > 5 else None
    env = jinja_env()
    failed = 0
    dumped = []
    for name in TEMPLATES:
        folder = os.path.join(work, name) + "/"
        subprocess.run([nerve, "export", model, "-z", tok, "-o", folder, "--chat-template", name], check=True,
                       stderr=subprocess.DEVNULL)
        cfg = json.load(open(os.path.join(folder, "tokenizer_config.json")))
        template = env.from_string(cfg["chat_template"])
        bos = cfg["bos_token"] if cfg.get("add_bos_token") else None
        port = free_port()
        server = subprocess.Popen([nerve, "serve", "-m", model, "-z", tok, "--chat-template", name, "--port", str(port),
                                   "--no-prefix-cache", "--kv-memory", "16M"], stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    post(port, "/tokenize", {"content": ""})
                    break
                except (urllib.error.URLError, ConnectionError):
                    time.sleep(0.05)
            same = 0
            for k, (messages, extra) in enumerate(CASES):
                body = dict(extra, messages=messages)
                theirs = post(port, "/apply-template", body)["prompt"]
                variables = dict(extra.get("chat_template_kwargs", {}), messages=messages, tools=extra.get("tools"),
                                 bos_token=bos, eos_token=cfg["eos_token"], add_generation_prompt=True)
                ours = template.render(**variables)
                dumped.append({"template": name, "case": k, "jinja": cfg["chat_template"], "variables": variables,
                               "prompt": theirs})
                if ours == theirs:
                    same += 1
                else:
                    failed += 1
                    print(f"{name} case {k}:\n  jinja: {ours!r}\n  nerve: {theirs!r}")
            print(f"chat_template_check: {name}: {same}/{len(CASES)} conversations rendered alike")
        finally:
            server.terminate()
            server.wait()
    if dump:
        json.dump(dumped, open(dump, "w"), ensure_ascii=False)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
