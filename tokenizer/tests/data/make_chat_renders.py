"""Writes tokenizer/tests/data/chat_renders.json: chat requests rendered with real published
chat templates by HuggingFace transformers itself, computed here without any warmpath code.

- Templates: the files in templates/ (see README.md for where each comes from) and the
  chat_template of qwen3/tokenizer_config.json, each with its model's special tokens.
- Rendering: transformers.utils.chat_template_utils.render_jinja_template, the function
  apply_chat_template calls (its jinja2 environment: sandboxed, trim_blocks, lstrip_blocks,
  loopcontrols, the generation tag, tojson = json.dumps, raise_exception, strftime_now),
  with the special tokens passed as apply_chat_template passes special_tokens_map, and
  chat_template_kwargs on top as vLLM passes them. strftime_now reads a fixed clock,
  NOW below (datetime.now() patched in transformers' module).
- Messages: reshaped as vLLM's chat_utils does before apply_chat_template, written again
  here from vLLM's code: in the "string" content format content flattened to one string
  (text parts joined with "\\n", null -> ""), in the "openai" one a list of
  {"type": "text", "text": ...} parts (a string: one part; null: none), the format detected
  from the template's syntax tree as vLLM does (content_format below); role/content/name
  kept, tool_calls (assistant) with function.arguments
  json.loads-ed ("" or null -> {}), tool_call_id (tool), reasoning/reasoning_content;
  tools as ChatCompletionToolsParam.model_dump() writes them (type, function{name,
  description, parameters, ...}).
- A template that raises records the exception's message instead of a render, and whether
  it was the template's own raise_exception ("raised") or a Python error ("python").

    pip install transformers==5.23.0   # pulls jinja2 >= 3.1.6
    python3 tokenizer/tests/data/make_chat_renders.py
"""

import datetime
import json
import os

import jinja2.exceptions
import jinja2.nodes
import transformers
from transformers.utils import chat_template_utils

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "chat_renders.json")
NOW = datetime.datetime(2024, 7, 6, 15, 4, 5)
NOW_ARG = "2024-07-06T15:04:05"


class FixedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


chat_template_utils.datetime = FixedDatetime

LLAMA3 = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
TEMPLATES = {
    "llama-3.1": ("templates/meta-llama-Llama-3.1-8B-Instruct.jinja", LLAMA3),
    "llama-3.2": ("templates/meta-llama-Llama-3.2-3B-Instruct.jinja", LLAMA3),
    "llama-3.3": ("templates/meta-llama-Llama-3.3-70B-Instruct.jinja", LLAMA3),
    "qwen2.5": (
        "templates/Qwen-Qwen2.5-7B-Instruct.jinja",
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    ),
    "qwen3": ("qwen3/tokenizer_config.json", None),
    "mistral-nemo": (
        "templates/mistralai-Mistral-Nemo-Instruct-2407.jinja",
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    ),
    "deepseek-r1-distill-llama": (
        "templates/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
        {
            "bos_token": "<｜begin▁of▁sentence｜>",
            "eos_token": "<｜end▁of▁sentence｜>",
            "pad_token": "<｜end▁of▁sentence｜>",
        },
    ),
}
# More published templates (llama.cpp's copies, same sdist), with special tokens as written here
# (the model's BOS / EOS where known: both sides of the comparison get the same ones).
DEEPSEEK = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}
CHATML = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
COHERE = {"bos_token": "<BOS_TOKEN>", "eos_token": "<|END_OF_TURN_TOKEN|>"}
MISTRAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
GRANITE = {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>"}
HERMES = {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"}
MORE = {
    "gemma-2": ("google-gemma-2-2b-it", {"bos_token": "<bos>", "eos_token": "<eos>"}),
    "gemma-4": ("google-gemma-4-31B-it", {"bos_token": "<bos>", "eos_token": "<eos>"}),
    "phi-3.5": ("microsoft-Phi-3.5-mini-instruct", {"bos_token": "<s>", "eos_token": "<|endoftext|>"}),
    "hermes-2-pro-tool-use": ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", HERMES),
    "hermes-3-tool-use": ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", HERMES),
    "command-r-plus-tool-use": ("CohereForAI-c4ai-command-r-plus-tool_use", COHERE),
    "command-r7b-tool-use": ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", COHERE),
    "granite-3.3": ("ibm-granite-granite-3.3-2B-Instruct", GRANITE),
    "granite-4.0": ("ibm-granite-granite-4.0", GRANITE),
    "gpt-oss": ("openai-gpt-oss-120b", {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"}),
    "mistral-small-3.2": ("Mistral-Small-3.2-24B-Instruct-2506", MISTRAL),
    "devstral-small": ("unsloth-mistral-Devstral-Small-2507", MISTRAL),
    "kimi-k2": ("moonshotai-Kimi-K2", {"bos_token": "[BOS]", "eos_token": "[EOS]"}),
    "smollm3": ("HuggingFaceTB-SmolLM3-3B", {"eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}),
    "functionary-3.2": ("meetkai-functionary-medium-v3.2", LLAMA3),
    "deepseek-v3.1": ("deepseek-ai-DeepSeek-V3.1", DEEPSEEK),
    "glm-4.6": ("GLM-4.6", {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}),
    "qwen3-coder": ("Qwen3-Coder", CHATML),
    "qwq": ("Qwen-QwQ-32B", CHATML),
    "qwen3.5": ("Qwen3.5-4B", CHATML),
    "apriel-1.5": ("unsloth-Apriel-1.5", {"bos_token": "<s>", "eos_token": "<|end|>"}),
    "deepseek-v3.2": ("deepseek-ai-DeepSeek-V3.2", DEEPSEEK),
    "glm-4.7-flash": ("GLM-4.7-Flash", {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}),
    "minimax-m2": ("MiniMax-M2", {"bos_token": "]~!b[", "eos_token": "[e~["}),
    "nemotron-nano-v2": ("NVIDIA-Nemotron-Nano-v2", {"bos_token": "<SPECIAL_10>", "eos_token": "<SPECIAL_12>"}),
    "seed-oss": ("ByteDance-Seed-OSS", {"bos_token": "<seed:bos>", "eos_token": "<seed:eos>"}),
    "kimi-k2-thinking": ("Kimi-K2-Thinking", {"bos_token": "[BOS]", "eos_token": "[EOS]"}),
    "ministral-3-reasoning": ("mistralai-Ministral-3-14B-Reasoning-2512", MISTRAL),
    "lfm2": ("LFM2-8B-A1B", {"bos_token": "<|startoftext|>", "eos_token": "<|im_end|>"}),
    "granite-4.1": ("ibm-granite-granite-4.1", GRANITE),
}
TEMPLATES.update({k: (f"templates/{f}.jinja", tokens) for k, (f, tokens) in MORE.items()})


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city, in °C",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
                "days": {"type": "integer", "minimum": 1, "maximum": 0.5e1},
            },
            "required": ["city"],
        },
    },
}
# No description: vLLM's model_dump writes "description": null.
TIME_TOOL = {"function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}, "type": "function"}

CALL = {
    "id": "call12345",
    "type": "function",
    "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"days\": 2}"},
}

CASES = {
    "simple": {
        "messages": [
            {"role": "system", "content": "  You are terse.  "},
            {"role": "user", "content": "Hello there"},
        ],
    },
    "multi_turn": {
        "messages": [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": [{"type": "text", "text": "And 3+3?"}, {"type": "text", "text": "Be brief."}]},
        ],
    },
    "no_generation_prompt": {
        "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}],
        "add_generation_prompt": False,
    },
    "tools": {
        "messages": [
            {"role": "system", "content": "Use tools when useful."},
            {"role": "user", "content": "Weather in Zürich for two days?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21.5}"},
        ],
        "tools": [WEATHER_TOOL, TIME_TOOL],
    },
    "two_tool_calls": {
        "messages": [
            {"role": "user", "content": "Weather in Zürich and the time?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [CALL, {"id": "call67890", "type": "function", "function": {"name": "get_time", "arguments": ""}}],
            },
        ],
        "tools": [WEATHER_TOOL, TIME_TOOL],
    },
    "alternation_broken": {
        "messages": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
    },
    "thinking_kwargs": {
        "messages": [{"role": "user", "content": "Quick answer: capital of France?"}],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "reasoning_history": {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
            {"role": "user", "content": "3+3?"},
        ],
    },
}


def is_var(node, name):
    return isinstance(node, jinja2.nodes.Name) and node.name == name


def is_member(node, name, key):
    """`name[key]` or `name.key`."""
    if isinstance(node, jinja2.nodes.Getitem):
        return is_var(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return is_var(node.node, name) and node.attr == key
    return False


def reads(node, name, key=None):
    """`name` (or `name[key]`), possibly sliced, filtered or tested."""
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and reads(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return reads(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return reads(node.node, name, key)
    return is_member(node, name, key) if key else is_var(node, name)


def content_format(template):
    """vLLM's automatic chat template content format (chat_utils `_detect_content_format`),
    written again here on jinja2's syntax tree: "openai" when a loop iterates a message's
    `content` (a message being a loop variable over `messages` or a variable set from it),
    or a variable named `content` (vLLM since #42660); else "string" (also when the template
    does not parse, or a variable it follows is not one name: vLLM's assertion fails)."""
    try:
        ast = chat_template_utils._compile_jinja_template(template).environment.parse(template)
    except Exception:  # noqa: BLE001 - vLLM falls back to "string" the same way
        return "string"
    # Where a target vLLM follows is not one name, its assertion fails: "string".
    names, i = ["messages"], 0
    while i < len(names):
        for assign in ast.find_all(jinja2.nodes.Assign):
            if reads(assign.node, names[i]):
                if not isinstance(assign.target, jinja2.nodes.Name):
                    return "string"
                if assign.target.name not in names:
                    names.append(assign.target.name)
        i += 1
    loops = list(ast.find_all(jinja2.nodes.For))
    items = []
    for f in loops:
        if any(reads(f.iter, n) for n in names):
            if not isinstance(f.target, jinja2.nodes.Name):
                return "string"
            items.append(f.target.name)
    for f in loops:  # the first loop over a message's content decides
        if any(reads(f.iter, m, "content") for m in items) or is_var(f.iter, "content"):
            return "openai" if isinstance(f.target, jinja2.nodes.Name) else "string"
    return "string"


def vllm_message(m, fmt):
    content = m.get("content")
    if content is None:
        parts = []
    elif isinstance(content, str):
        parts = [content]
    else:
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif p.get("type") in ("text", "input_text", "output_text"):
                parts.append({"text": p["text"]})
            elif p.get("type") == "refusal":
                parts.append({"text": p["refusal"]})
    if fmt == "openai":
        # Each text part as {"type": "text", "text": ...}; a bare string part in a list of
        # parts stays a string, as vLLM leaves it.
        if isinstance(content, str):
            text = [{"type": "text", "text": content}]
        else:
            text = [p if isinstance(p, str) else {"type": "text", "text": p["text"]} for p in parts]
    else:
        text = "\n".join(p if isinstance(p, str) else p["text"] for p in parts)
    out = {"role": m["role"], "content": text}
    if m["role"] == "assistant":
        if m.get("tool_calls") is not None:
            calls = []
            for c in m["tool_calls"]:
                c = json.loads(json.dumps(c))
                args = c["function"].get("arguments")
                c["function"]["arguments"] = json.loads(args) if args else {}
                calls.append(c)
            out["tool_calls"] = calls
        reasoning = m.get("reasoning") or m.get("reasoning_content")
        if reasoning is not None:
            out["reasoning"] = reasoning
            out["reasoning_content"] = reasoning
    elif m["role"] == "tool" and "tool_call_id" in m:
        out["tool_call_id"] = m["tool_call_id"]
    if isinstance(m.get("name"), str):
        out["name"] = m["name"]
    return out


def vllm_tool(t):
    f = t["function"]
    function = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
    function.update({k: v for k, v in f.items() if k not in function})
    out = {"type": t.get("type", "function"), "function": function}
    out.update({k: v for k, v in t.items() if k not in out})
    return out


def load(path, specials):
    with open(os.path.join(HERE, path), encoding="utf-8") as f:
        text = f.read()
    if specials is not None:
        return text, dict(specials)
    config = json.loads(text)
    tokens = {}
    for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = config.get(k)
        v = v.get("content") if isinstance(v, dict) else v
        if v is not None:
            tokens[k] = v
    if config.get("additional_special_tokens"):
        tokens["additional_special_tokens"] = config["additional_special_tokens"]
    return config["chat_template"], tokens


def main():
    renders = []
    for name, (path, specials) in TEMPLATES.items():
        template, tokens = load(path, specials)
        fmt = content_format(template)
        for case, request in CASES.items():
            kwargs = {**tokens, **request.get("chat_template_kwargs", {})}
            tools = request.get("tools")
            try:
                text = chat_template_utils.render_jinja_template(
                    conversations=[[vllm_message(m, fmt) for m in request["messages"]]],
                    tools=[vllm_tool(t) for t in tools] if tools is not None else None,
                    chat_template=template,
                    add_generation_prompt=request.get("add_generation_prompt", True),
                    **kwargs,
                )
                text = text[0][0] if isinstance(text, tuple) else text
                if isinstance(text, list):
                    text = text[0]
                result = {"rendered": text}
            except Exception as e:  # noqa: BLE001 - the template's own exception is the expectation
                # "raised": the template's raise_exception (jinja2's TemplateError itself);
                # "python": anything else (a TypeError, an undefined name), whose message is
                # Python's own.
                kind = "raised" if type(e) is jinja2.exceptions.TemplateError else "python"
                result = {"error": str(e), "error_kind": kind}
            renders.append({"template": name, "case": case, **result})
    out = {
        "generator": f"transformers {transformers.__version__} render_jinja_template",
        "now": NOW_ARG,
        "templates": {
            k: {"path": p, "special_tokens": load(p, s)[1], "content_format": content_format(load(p, s)[0])}
            for k, (p, s) in TEMPLATES.items()
        },
        "cases": CASES,
        "renders": renders,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(renders)} renders to {OUT}")


if __name__ == "__main__":
    main()
