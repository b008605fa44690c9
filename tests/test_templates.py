"""Prompt formats: Vicuna v1.1 byte for byte against the published format, automatic choice, tokenisation."""
import json

import pytest

from evaluation import templates as TP
from evaluation.questions import build_messages

SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
          "The assistant gives helpful, detailed, and polite answers to the user's questions.")


class _NoTemplateTok:
    """A Vicuna-like tokenizer without a chat template: BOS id 1 prepended when special tokens are added."""

    chat_template = None

    def __init__(self):
        self.calls = []

    def __call__(self, text, add_special_tokens=True):
        self.calls.append((text, add_special_tokens))
        return {"input_ids": ([1] if add_special_tokens else []) + [ord(c) for c in text]}


class _ChatTok(_NoTemplateTok):
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt else "")


def test_vicuna_v11_one_and_two_turns_byte_for_byte():
    fmt = TP.choose_format("lmsys/vicuna-7b-v1.3", _NoTemplateTok())
    assert (fmt.name, fmt.reason) == ("vicuna_v1.1", "no chat template; model family vicuna")
    one = fmt.render(None, build_messages(["What is 2+2?"], []))
    assert one == SYSTEM + " USER: What is 2+2? ASSISTANT:"
    two = fmt.render(None, build_messages(["What is 2+2?", "And 3+3?"], ["4."]))
    assert two == SYSTEM + " USER: What is 2+2? ASSISTANT: 4.</s>USER: And 3+3? ASSISTANT:"
    assert two.encode("utf-8") == (SYSTEM + " USER: What is 2+2? ASSISTANT: 4.</s>USER: And 3+3? ASSISTANT:").encode()


def test_fastchat_prompts_get_bos_chat_templates_do_not():
    tok = _NoTemplateTok()
    ids = TP.PromptFormat("vicuna_v1.1", "fschat", "test").ids(tok, build_messages(["hi"], []))
    assert ids[0] == 1 and tok.calls[-1][1] is True          # tokenizer(prompt).input_ids, as FastChat/EAGLE
    chat = _ChatTok()
    fmt = TP.choose_format("default", chat)
    assert (fmt.name, fmt.source) == ("chat_template", "tokenizer")
    ids = fmt.ids(chat, build_messages(["hi"], []))
    assert "".join(map(chr, ids)) == "<user>hi<assistant>" and chat.calls[-1][1] is False


def test_choice_rules_and_errors():
    assert TP.choose_format("lmsys/vicuna-7b-v1.3", _ChatTok()).name == "chat_template"   # a template wins
    assert TP.choose_format("m", _NoTemplateTok(), "vicuna_v1.1").reason == "--template"
    assert TP.choose_format("m", _ChatTok(), "chat_template").name == "chat_template"
    with pytest.raises(ValueError, match="--template"):
        TP.choose_format("some/unknown-model", _NoTemplateTok())
    with pytest.raises(ValueError, match="no chat template"):
        TP.choose_format("m", _NoTemplateTok(), "chat_template")
    with pytest.raises(ValueError, match="unknown template"):
        TP.check_template_name("vicuna_v9")
    assert "vicuna_v1.1" in TP.fastchat_template_names()
    assert TP.PromptFormat("vicuna_v1.1", "fschat 0.2.36", "x").describe() == {
        "name": "vicuna_v1.1", "source": "fschat 0.2.36", "reason": "x"}


def test_local_folder_chat_template_detection(tmp_path):
    assert TP.local_chat_template_known(tmp_path / "missing") is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    assert TP.local_chat_template_known(tmp_path) is False
    (tmp_path / "chat_template.jinja").write_text("{{ x }}")
    assert TP.local_chat_template_known(tmp_path) is True
