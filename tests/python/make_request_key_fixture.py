"""Writes agent/src/proxy/fixtures/request_keys.json: request bodies with the token ids and
router keys the agent must compute for them, computed here without any warmpath code.

- Token ids: the HuggingFace `tokenizers` package on tokenizer/assets/default-tokenizer/
  tokenizer.json (completions with add_special_tokens=True, as vLLM does by default).
- Chat prompts: the `chat_template` of tokenizer_config.json rendered with jinja2 the way
  transformers' apply_chat_template does (sandboxed, trim_blocks, lstrip_blocks, bos/eos
  tokens in the context), text parts of a message joined with "\\n", then tokenized with
  add_special_tokens=False (vLLM's chat default).
- Keys: the key scheme of agent/src/kv_index/keys.rs, written again here from its doc:
  key = xxh3_64(seed "warmpath"; parent header | token ids as LE u32 | extra keys), where the
  header is the parent key XOR 0x9e3779b97f4a7c15 as LE u64 (0 without a parent) plus one byte
  1/0 for parent present/absent, and each extra key is its UTF-8 length as LE u32 then its
  bytes: the LoRA name on every block, then cache_salt on block 0 only. Full blocks only.

    pip install tokenizers jinja2 xxhash
    python3 tests/python/make_request_key_fixture.py
"""

import json
import os
import struct

import jinja2.sandbox
import xxhash
from tokenizers import Tokenizer

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
ASSETS = os.path.join(ROOT, "tokenizer", "assets", "default-tokenizer")
OUT = os.path.join(ROOT, "agent", "src", "proxy", "fixtures", "request_keys.json")

SEED = int.from_bytes(b"warmpath", "big")
PARENT_MIX = 0x9E3779B97F4A7C15


def block_key(parent, tokens, extras):
    header = struct.pack("<QB", 0 if parent is None else parent ^ PARENT_MIX, parent is not None)
    body = b"".join(struct.pack("<I", t) for t in tokens)
    tail = b"".join(struct.pack("<I", len(e.encode())) + e.encode() for e in extras)
    return xxhash.xxh3_64_intdigest(header + body + tail, seed=SEED)


def request_keys(ids, block_size, lora=None, salt=None):
    keys = []
    for i in range(len(ids) // block_size):
        extras = ([lora] if lora else []) + ([salt] if salt and i == 0 else [])
        keys.append(block_key(keys[-1] if keys else None, ids[i * block_size : (i + 1) * block_size], extras))
    return keys


def load():
    tok = Tokenizer.from_file(os.path.join(ASSETS, "tokenizer.json"))
    with open(os.path.join(ASSETS, "tokenizer_config.json")) as f:
        config = json.load(f)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(config["chat_template"])
    return tok, config, template


def flatten(content):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p.get("type") == "text")


COMPLETIONS = [
    ("completion_text", {"model": "m", "prompt": "The quick brown fox jumps over the lazy dog again and again and again"}, 4),
    (
        "completion_text_16",
        {
            "prompt": "Routers that index KV events hash blocks in their own key space, from the "
            "token ids carried in each BlockStored event, so block size and tokenization must "
            "match the engine exactly."
        },
        16,
    ),
    ("completion_salted", {"prompt": "The quick brown fox jumps over the lazy dog", "cache_salt": "tenant-a"}, 4),
    ("completion_ids_salted", {"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "cache_salt": "t"}, 4),
    ("completion_ids", {"prompt": [1, 2, 3, 4, 5, 6, 7, 8]}, 4),
]

CHATS = [
    (
        "chat_parts",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}]},
        4,
    ),
    (
        "chat_system_and_parts",
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "You are a terse assistant."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Summarize this:"},
                        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
                        {"type": "text", "text": "prefix caching in vLLM"},
                    ],
                },
            ],
            "cache_salt": "tenant-b",
        },
        4,
    ),
]


def main():
    tok, config, template = load()
    cases = []
    for name, body, bs in COMPLETIONS:
        prompt = body["prompt"]
        ids = prompt if isinstance(prompt, list) else tok.encode(prompt, add_special_tokens=True).ids
        cases.append((name, "completion", body, bs, None, ids))
    for name, body, bs in CHATS:
        messages = [{"role": m["role"], "content": flatten(m.get("content"))} for m in body["messages"]]
        text = template.render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=config.get("bos_token"),
            eos_token=config.get("eos_token"),
        )
        ids = tok.encode(text, add_special_tokens=False).ids
        cases.append((name, "chat", body, bs, text, ids))
    out = []
    for name, kind, body, bs, text, ids in cases:
        case = {"name": name, "kind": kind, "body": json.dumps(body), "block_size": bs}
        if text is not None:
            case["rendered"] = text
        case["token_ids"] = ids
        case["keys"] = request_keys(ids, bs, salt=body.get("cache_salt"))
        out.append(case)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{os.path.normpath(OUT)}: {len(out)} cases")


if __name__ == "__main__":
    main()
