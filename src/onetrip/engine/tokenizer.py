"""Text in and out of a Hugging Face model directory, without transformers.

    tok = Tokenizer.from_dir("checkpoints/Llama-3.2-1B-Instruct")
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])   # str
    ids = tok.encode(prompt, add_special_tokens=False)                      # the template holds the BOS
    stream = IncrementalDecoder(tok)
    for token in generated:                                                 # as the engine yields them
        print(stream.push(token), end="", flush=True)
    print(stream.flush())

What is read from the directory (the files a Hub checkpoint ships):
    tokenizer.json          required; the ``tokenizers`` model, normalizer, pre-tokenizer,
                            post-processor (which adds the BOS) and decoder
    tokenizer_config.json   chat_template (one string, or a list of named templates),
                            bos_token / eos_token / ... (strings or {"content": ...}),
                            add_bos_token / add_eos_token (see below)
    chat_template.jinja     the newer home of the template; wins over tokenizer_config.json
    generation_config.json  eos_token_id (int or list): the ids that end a generation
    config.json             eos_token_id, when generation_config.json has none

As in transformers 5, tokenizer.json's post-processor decides what ``encode`` adds; the
config's add_bos_token / add_eos_token only apply when tokenizer.json has no post-processor.

Chat templates are rendered the way transformers renders them: a sandboxed Jinja
environment (``ImmutableSandboxedEnvironment``, so a template from the Hub cannot reach
Python internals) with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
extension, a ``tojson`` filter that keeps non-ASCII text, and the globals
``raise_exception`` and ``strftime_now``; the special tokens (``bos_token``, ...) are
template variables.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import jinja2
import jinja2.ext
import jinja2.nodes
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import processors

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
ChatTemplate = Union[str, Mapping[str, str]]


@dataclass(frozen=True, eq=False)
class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus what a chat engine needs from the model directory.

    Attributes:
        backend: the ``tokenizers.Tokenizer`` (tokenizer.json).
        chat_template: a Jinja string, a {name: template} mapping, or None.
        special_tokens: {"bos_token": "<s>", "eos_token": ...}: the template variables.
        eos_ids: token ids that end a generation, in the order found (generation_config.json,
            config.json, then the eos_token); may be empty.
        bos_id: id of ``bos_token``, or None when the tokenizer has none.
        path: the directory it was loaded from (for error messages), or None.
    """

    backend: tokenizers.Tokenizer
    chat_template: Optional[ChatTemplate] = None
    special_tokens: Mapping[str, str] = field(default_factory=dict)
    eos_ids: tuple[int, ...] = ()
    bos_id: Optional[int] = None
    path: Optional[Path] = None

    @classmethod
    def from_dir(cls, path: Union[str, Path]) -> "Tokenizer":
        """Load a Hugging Face model or tokenizer directory (see the module docstring)."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"tokenizer directory {str(path)!r} does not exist")
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {str(path)!r}: a Hugging Face 'fast' tokenizer "
                                    f"file is required (sentencepiece-only checkpoints are not supported)")
        backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        config = _read_json(path / "tokenizer_config.json")
        special = {name: _token_text(config[name]) for name in SPECIAL_TOKEN_NAMES
                   if _token_text(config.get(name)) is not None}
        if backend.post_processor is None and (config.get("add_bos_token") or config.get("add_eos_token")):
            backend.post_processor = _bos_eos_processor(backend, special, config)

        eos_ids: list[int] = []
        for source in (_read_json(path / "generation_config.json"), _read_json(path / "config.json")):
            eos_ids += _as_ids(source.get("eos_token_id"), path)
            if eos_ids:
                break
        eos_token = special.get("eos_token")
        if eos_token is not None and backend.token_to_id(eos_token) is not None:
            eos_ids.append(backend.token_to_id(eos_token))
        bos_id = backend.token_to_id(special["bos_token"]) if "bos_token" in special else None
        return cls(backend, _find_chat_template(path, config), special, tuple(dict.fromkeys(eos_ids)),
                   bos_id, path)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the model's embedding may be padded larger)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> Optional[int]:
        return self.backend.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` runs the post-processor (the BOS)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (an int sequence, or a 1-D integer tensor)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, *,
                            tools: Optional[Sequence[Mapping[str, Any]]] = None,
                            documents: Optional[Sequence[Mapping[str, Any]]] = None,
                            template: Optional[str] = None, **variables: Any) -> str:
        """Render a conversation with the model's chat template.

        Args:
            messages: [{"role": "system" | "user" | "assistant" | ..., "content": str}, ...].
            add_generation_prompt: end with the header that opens the assistant's turn.
            tools, documents: passed to the template as JSON-like data, when it uses them.
            template: the name of one of several named templates, or a Jinja string to use
                instead of the model's.
            **variables: extra template variables (e.g. ``enable_thinking=False``); they
                override the special tokens of the same name.

        Returns:
            The prompt text; encode it with ``add_special_tokens=False`` (or use
            :meth:`encode_chat`), since templates write the BOS themselves.

        Raises:
            ValueError: no chat template, or several with none named/default.
            jinja2.TemplateError: the template refused the conversation (``raise_exception``).
        """
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
            raise TypeError(f"messages must be a list of dicts, got {type(messages).__name__}")
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping):
                raise TypeError(f"messages[{i}] must be a dict with 'role' and 'content', got {message!r}")
        source = self._select_template(template, tools)
        context = {**self.special_tokens, **variables}
        return _compile(source).render(messages=[dict(m) for m in messages], tools=tools, documents=documents,
                                       add_generation_prompt=add_generation_prompt, **context)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    **kwargs: Any) -> list[int]:
        """``encode(apply_chat_template(...), add_special_tokens=False)``: the prompt ids."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, **kwargs),
                           add_special_tokens=False)

    def _select_template(self, template: Optional[str], tools) -> str:
        templates = self.chat_template
        if isinstance(templates, Mapping):
            if template is not None:
                return templates.get(template, template)  # a name, or else a template string
            if tools and "tool_use" in templates:
                return templates["tool_use"]
            if "default" in templates:
                return templates["default"]
            raise ValueError(f"the tokenizer in {str(self.path)!r} has chat templates {sorted(templates)} and "
                             f"none is named 'default': pass template=<name>")
        if template is not None:
            return template
        if templates is None:
            raise ValueError(f"the tokenizer in {str(self.path)!r} has no chat template (looked for "
                             f"chat_template.jinja and 'chat_template' in tokenizer_config.json); pass "
                             f"template=<jinja string>, or encode plain text with encode()")
        return templates


class IncrementalDecoder:
    """Streams text as tokens arrive, never cutting a character in half.

    A byte-level tokenizer can split one UTF-8 character (3 bytes for "日", 4 for an emoji)
    across tokens; decoding the partial bytes gives U+FFFD. ``push`` holds text back while
    the decoded tail ends in U+FFFD and releases it once the character is complete.

    Each push decodes a short window: from the start of the previously released piece to the
    end, and subtracts the text of that piece, so decoders that depend on context (the
    SentencePiece leading-space rule) give the same characters as one decode of everything.
    The concatenation of all pushes and ``flush`` equals ``tokenizer.decode(all_ids)``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # window start: the first token of the last released piece
        self._read = 0    # tokens before this are released

    def push(self, ids: Union[int, Iterable[int]]) -> str:
        """Add one token id (or several) and return the newly complete text ('' if none)."""
        self._ids.extend([int(ids)] if isinstance(ids, int) or getattr(ids, "ndim", 1) == 0 else map(int, ids))
        before = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self._ids))
        if len(text) <= len(before) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(before):]

    def flush(self) -> str:
        """Return whatever is held back (an incomplete character decodes to U+FFFD)."""
        before = self._decode(self._prefix, self._read)
        text = self._decode(self._prefix, len(self._ids))
        self._prefix = self._read = len(self._ids)
        return text[len(before):]

    def _decode(self, start: int, stop: int) -> str:
        return self.tokenizer.decode(self._ids[start:stop], skip_special_tokens=self.skip_special_tokens)


# ---- loading helpers --------------------------------------------------------------------------

def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{str(path)!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object, got {type(data).__name__}")
    return data


def _token_text(value: Any) -> Optional[str]:
    """A special token as written in tokenizer_config.json: "<s>" or {"content": "<s>", ...}."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _as_ids(value: Any, path: Path) -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"eos_token_id in {str(path)!r} must be an int or a list of ints, got {value!r}")
    return list(values)


def _bos_eos_processor(backend: tokenizers.Tokenizer, special: Mapping[str, str], config: Mapping) -> Any:
    """TemplateProcessing that adds the BOS / EOS the config asks for (no-post-processor case)."""
    parts = {}
    for flag, name in (("add_bos_token", "bos_token"), ("add_eos_token", "eos_token")):
        token = special.get(name)
        if config.get(flag) and token is not None and backend.token_to_id(token) is not None:
            parts[name] = token
    bos = f"{parts['bos_token']} " if "bos_token" in parts else ""
    eos = f" {parts['eos_token']}" if "eos_token" in parts else ""
    return processors.TemplateProcessing(
        single=f"{bos}$A{eos}", pair=f"{bos}$A{eos} {bos}$B:1{eos}",
        special_tokens=[(t, backend.token_to_id(t)) for t in parts.values()])


def _find_chat_template(path: Path, config: Mapping) -> Optional[ChatTemplate]:
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if template is None:
        template = _read_json(path / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        try:
            return {t["name"]: t["template"] for t in template}
        except (TypeError, KeyError):
            raise ValueError(f"chat_template in {str(path)!r} must be a string or a list of "
                             f"{{'name', 'template'}} objects") from None
    if template is not None and not isinstance(template, str):
        raise ValueError(f"chat_template in {str(path)!r} must be a string, got {type(template).__name__}")
    return template


# ---- Jinja ------------------------------------------------------------------------------------

class _GenerationTag(jinja2.ext.Extension):
    """Accepts ``{% generation %}...{% endgeneration %}`` (used by training templates to mark
    the assistant's tokens) and renders the body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: Optional[int] = None, separators=None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML; prompts want the plain JSON text.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols, _GenerationTag])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)
