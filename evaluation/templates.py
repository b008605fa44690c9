"""Prompt formats: the tokenizer's chat template, or a FastChat conversation template.

A model whose tokenizer ships a chat template keeps using it. A model without one gets the
conversation format it was trained with: FastChat's templates (package ``fschat``, module
``fastchat.conversation``), chosen

* explicitly with ``--template NAME`` (any FastChat template name, or ``chat_template`` to force the
  tokenizer's own), or
* automatically for known families (:data:`KNOWN_FAMILIES`: a model whose name or path contains
  ``vicuna`` -> ``vicuna_v1.1``, the format of the EAGLE and UniVer papers' Vicuna runs).

Vicuna v1.1 (FastChat ``vicuna_v1.1``: system message, ``sep=" "``, ``sep2="</s>"``), for a
two-turn question with the model's own first answer ``a1``::

    "<system message> USER: q1 ASSISTANT: a1</s>USER: q2 ASSISTANT:"

FastChat-formatted prompts are tokenised as FastChat and EAGLE do (``tokenizer(prompt).input_ids``,
i.e. with the tokenizer's special tokens such as BOS); chat-template prompts are rendered to text and
tokenised without extra special tokens (the template writes them).

``fschat`` is installed with ``--no-deps`` (``scripts/install.sh``): ``fastchat.conversation`` needs
only the standard library, while the package's declared dependencies are a web-server stack. Where
``fschat`` is not installed (e.g. a GPU machine with only torch and transformers), ``vicuna_v1.1`` alone
is still available from a built-in copy of FastChat 0.2.36's definition (:data:`BUILTIN_TEMPLATES`, the
same prompt byte for byte; the format's ``source`` then says ``built-in``); other FastChat names
need the package.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["CHAT_TEMPLATE", "KNOWN_FAMILIES", "FSCHAT_HINT", "BUILTIN_TEMPLATES", "BUILTIN_SOURCE", "PromptFormat",
           "fastchat_template_names", "fschat_installed", "render_builtin", "check_template_name", "family_template",
           "local_chat_template_known", "choose_format"]

#: ``--template`` value that means "the tokenizer's own chat template"
CHAT_TEMPLATE = "chat_template"
#: (substring of the lower-cased model name or path, FastChat template) for models without a chat template
KNOWN_FAMILIES = (("vicuna", "vicuna_v1.1"),)
FSCHAT_HINT = "pip install --no-deps fschat==0.2.36"
#: FastChat templates available without fschat: name -> (system message, (user role, assistant role), sep,
#: sep2), FastChat 0.2.36's ``SeparatorStyle.ADD_COLON_TWO`` definitions copied as they are
BUILTIN_TEMPLATES = {
    "vicuna_v1.1": ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                    "helpful, detailed, and polite answers to the user's questions.", ("USER", "ASSISTANT"), " ",
                    "</s>"),
}
#: ``PromptFormat.source`` of a built-in template
BUILTIN_SOURCE = "built-in (FastChat 0.2.36's definition; fschat not installed)"


def _conversation_module():
    try:
        import fastchat.conversation as conv
    except ImportError as e:  # pragma: no cover - fschat is installed by scripts/install.sh
        raise ModuleNotFoundError(f"FastChat templates need the package fschat; install it with: {FSCHAT_HINT}") from e
    return conv


def fschat_installed() -> bool:
    """Whether ``fastchat.conversation`` can be imported."""
    try:
        _conversation_module()
    except ModuleNotFoundError:
        return False
    return True


def render_builtin(name: str, messages: Sequence[dict]) -> str:
    """Prompt text of ``messages`` in the built-in copy of FastChat template ``name`` (FastChat's
    ``ADD_COLON_TWO`` rule: ``system sep`` then ``ROLE: message`` followed by sep / sep2 alternately, and
    ``ASSISTANT:`` for the generation prompt).

    Raises:
        KeyError: ``name`` is not in :data:`BUILTIN_TEMPLATES`.
        ValueError: a role other than ``user`` / ``assistant``.
    """
    system, roles, sep, sep2 = BUILTIN_TEMPLATES[name]
    turns = []
    for m in messages:
        role = {"user": roles[0], "assistant": roles[1]}.get(m["role"])
        if role is None:
            raise ValueError(f"message role must be 'user' or 'assistant', got {m['role']!r}")
        turns.append((role, m["content"]))
    turns.append((roles[1], None))
    out = system + sep
    for i, (role, message) in enumerate(turns):
        out += f"{role}: {message}{(sep, sep2)[i % 2]}" if message else f"{role}:"
    return out


def fastchat_template_names() -> list[str]:
    """Names of FastChat's registered conversation templates (sorted)."""
    return sorted(_conversation_module().conv_templates)


def check_template_name(name: str) -> str:
    """Return ``name`` if it is ``chat_template`` or a FastChat template.

    Raises:
        ValueError: an unknown name (the message lists a few known ones).
        ModuleNotFoundError: ``fschat`` is not installed (the message says how to install it).
    """
    if name == CHAT_TEMPLATE or (name in BUILTIN_TEMPLATES and not fschat_installed()):
        return name
    names = fastchat_template_names()
    if name not in names:
        close = [n for n in names if name.split("_")[0].lower() in n.lower()][:6] or names[:6]
        raise ValueError(f"unknown template {name!r}; use {CHAT_TEMPLATE!r} or a FastChat template, e.g. {close}")
    return name


def family_template(model_name: str) -> Optional[str]:
    """FastChat template of a known model family (:data:`KNOWN_FAMILIES`) from its name/path, else None."""
    s = str(model_name).lower()
    for key, template in KNOWN_FAMILIES:
        if key in s:
            return template
    return None


def local_chat_template_known(folder: str | Path) -> Optional[bool]:
    """Whether a local model folder ships a chat template (``chat_template.jinja``/``.json`` or the
    ``chat_template`` key of ``tokenizer_config.json``); None when it cannot be told (not a folder,
    no tokenizer config)."""
    p = Path(folder)
    if not p.is_dir():
        return None
    if (p / "chat_template.jinja").is_file() or (p / "chat_template.json").is_file():
        return True
    cfg = p / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    import json

    try:
        return bool(json.loads(cfg.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class PromptFormat:
    """How messages become prompt token ids.

    Attributes:
        name: ``"chat_template"`` or a FastChat template name (e.g. ``"vicuna_v1.1"``).
        source: ``"tokenizer"`` or ``"fschat <version>"``.
        reason: why it was chosen (``"--template"``, ``"tokenizer has a chat template"``, ``"family vicuna"``).
    """

    name: str
    source: str
    reason: str

    @property
    def is_chat_template(self) -> bool:
        return self.name == CHAT_TEMPLATE

    def render(self, tokenizer, messages: Sequence[dict]) -> str:
        """Prompt text of ``messages`` (``[{"role": "user"|"assistant", "content": str}, ...]``, ending
        with a user turn) followed by the assistant's generation prompt."""
        if self.is_chat_template:
            return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
        if self.name in BUILTIN_TEMPLATES and not fschat_installed():
            return render_builtin(self.name, messages)
        conv = _conversation_module().get_conv_template(self.name)
        for m in messages:
            role = {"user": conv.roles[0], "assistant": conv.roles[1]}.get(m["role"])
            if role is None:
                raise ValueError(f"message role must be 'user' or 'assistant', got {m['role']!r}")
            conv.append_message(role, m["content"])
        conv.append_message(conv.roles[1], None)
        return conv.get_prompt()

    def ids(self, tokenizer, messages: Sequence[dict]) -> list[int]:
        """Prompt token ids (see the module docstring for the special-token rule)."""
        text = self.render(tokenizer, messages)
        enc = tokenizer(text, add_special_tokens=not self.is_chat_template)
        return list(enc["input_ids"] if hasattr(enc, "keys") else enc)

    def describe(self) -> dict:
        """JSON-ready record for the answer files."""
        return {"name": self.name, "source": self.source, "reason": self.reason}


def _fschat_source() -> str:
    if not fschat_installed():
        return BUILTIN_SOURCE
    try:
        from importlib.metadata import version

        return f"fschat {version('fschat')}"
    except Exception:  # noqa: BLE001 - a source tree without metadata
        return "fschat"


def choose_format(model_name: str, tokenizer, template: Optional[str] = None) -> PromptFormat:
    """The prompt format for a loaded tokenizer (see the module docstring for the rule).

    Args:
        model_name: ``--model`` value (hub id, folder or ``default``), used for family detection.
        tokenizer: the model's tokenizer (``chat_template`` attribute read).
        template: ``--template`` value, or None for automatic choice.

    Raises:
        ValueError: ``--template chat_template`` for a tokenizer without one, an unknown template name,
            or a tokenizer without a chat template from an unknown family (the message names ``--template``).
    """
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if template is not None:
        check_template_name(template)
        if template == CHAT_TEMPLATE:
            if not has_chat:
                raise ValueError(f"--template {CHAT_TEMPLATE}: the tokenizer of {model_name} has no chat template")
            return PromptFormat(CHAT_TEMPLATE, "tokenizer", "--template")
        return PromptFormat(template, _fschat_source(), "--template")
    family = family_template(model_name)
    if family is not None and not has_chat:
        return PromptFormat(family, _fschat_source(), f"no chat template; model family {family.split('_')[0]}")
    if has_chat:
        return PromptFormat(CHAT_TEMPLATE, "tokenizer", "tokenizer has a chat template")
    raise ValueError(f"--template: the tokenizer of {model_name} has no chat template and its family is not "
                     f"known; pass --template NAME (a FastChat template, e.g. vicuna_v1.1)")
