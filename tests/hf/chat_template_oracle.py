"""The reference for tests/integration/data/chat_template_oracle_test.cc: renders every case with
transformers' apply_chat_template (tokenize=False) and computes the training view the C++
ChatTemplate::RenderForTraining must reproduce.

  chat_template_oracle.py INPUT.json OUTPUT.json

INPUT: {"tokenizer_json": path, "templates": {name: {"source", "special_tokens"}},
        "cases": [{"id", "template", "messages", "tools", "add_generation_prompt", "extra"}]}
       "snippets": [{"id", "source", "context"}]  (bare Jinja, transformers' environment)}
OUTPUT: {"results": [{"id", "text" | "error",
                      "training": {"text", "spans" (byte offsets), "error",
                                   "token_offsets" (byte offsets), "assistant_masks"}}],
         "snippets": [{"id", "text" | "error"}]}

Templates with {% generation %}: spans are transformers' generation indices, and the token mask is
apply_chat_template(return_assistant_tokens_mask=True, return_dict=True)'s. Others: for each
assistant message i, the text rendering messages[:i+1] adds beyond rendering messages[:i] with
add_generation_prompt=True, both prefixes of the full rendering (else an error naming i). A
generation prompt that is not a prefix (it opens a think block the turn does not show) counts up
to where it and the full rendering part, after the rendering of messages[:i] without it.
"""

import json
import re
import sys

from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

GENERATION_RE = re.compile(r"\{\%-?\s*generation\s*-?\%\}")


def byte_offset(text, char_index):
    return len(text[:char_index].encode("utf-8"))


def make_tokenizer(tokenizer_json, template):
    special = {k: v for k, v in template["special_tokens"].items() if isinstance(v, str)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=tokenizer_json, **special)
    tokenizer.chat_template = template["source"]
    return tokenizer


def render(tokenizer, messages, tools, add_generation_prompt, extra):
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False,
        **extra)


def training_view(tokenizer, source, messages, tools, extra):
    full = render(tokenizer, messages, tools, False, extra)
    view = {"text": full}
    if GENERATION_RE.search(source):
        rendered, indices = render_jinja_template(
            conversations=[messages], tools=tools, chat_template=source,
            return_assistant_tokens_mask=True, add_generation_prompt=False,
            **tokenizer.special_tokens_map, **extra)
        assert rendered[0] == full
        view["spans"] = [[byte_offset(full, s), byte_offset(full, e)] for s, e in indices[0]]
        out = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=False, tokenize=True, return_dict=True,
            return_assistant_tokens_mask=True, **extra)
        encoding = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        assert list(encoding["input_ids"]) == list(out["input_ids"])
        view["token_offsets"] = [[byte_offset(full, s), byte_offset(full, e)]
                                 for s, e in encoding["offset_mapping"]]
        view["assistant_masks"] = list(out["assistant_masks"])
        return view
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt = render(tokenizer, messages[:i], tools, True, extra)
        turn = render(tokenizer, messages[:i + 1], tools, False, extra)
        if full.startswith(prompt):
            start = len(prompt)
        else:
            # A generation prompt that opens more than the turn shows (R1's "<think>\n"): the
            # span starts where the prompt and the rendered turn part.
            plain = render(tokenizer, messages[:i], tools, False, extra)
            if not full.startswith(plain) or not prompt.startswith(plain):
                return {"error": f"message {i}: not a prefix of the full rendering"}
            start = len(plain)
            while start < min(len(prompt), len(full)) and prompt[start] == full[start]:
                start += 1
        if not full.startswith(turn) or len(turn) < start:
            return {"error": f"message {i}: not a prefix of the full rendering"}
        spans.append([byte_offset(full, start), byte_offset(full, len(turn))])
    view["spans"] = spans
    return view


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        request = json.load(f)
    tokenizers = {name: make_tokenizer(request["tokenizer_json"], template)
                  for name, template in request["templates"].items()}
    results = []
    for case in request["cases"]:
        tokenizer = tokenizers[case["template"]]
        source = request["templates"][case["template"]]["source"]
        extra = case.get("extra") or {}
        result = {"id": case["id"]}
        try:
            result["text"] = render(tokenizer, case["messages"], case.get("tools"),
                                    case["add_generation_prompt"], extra)
        except Exception as e:  # the template raised: the C++ side must fail too
            result["error"] = f"{type(e).__name__}: {e}"
        try:
            result["training"] = training_view(tokenizer, source, case["messages"],
                                               case.get("tools"), extra)
        except Exception as e:
            result["training"] = {"error": f"{type(e).__name__}: {e}"}
        results.append(result)
    snippets = []
    for snippet in request.get("snippets", []):
        result = {"id": snippet["id"]}
        try:
            result["text"] = _compile_jinja_template(snippet["source"]).render(
                **snippet.get("context", {}))
        except Exception as e:
            result["error"] = f"{type(e).__name__}: {e}"
        snippets.append(result)
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump({"results": results, "snippets": snippets}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
