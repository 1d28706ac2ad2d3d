"""onetrip.engine.tokenizer against transformers: a tiny byte-level BPE trained here, saved
as a Llama-3-like and a Qwen-like (ChatML) model directory with chat templates written for
these tests; encode, decode and the rendered chats must match AutoTokenizer's, and the
streaming decoder must rebuild one decode of the whole sequence."""

import json
import string

import jinja2
import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, normalizers, processors

from onetrip.engine import IncrementalDecoder, Tokenizer

from conftest import byte_bpe

CORPUS = [
    "The café serves coffee and crêpes.", "日本 is Japan; 日本語 is Japanese.", "We visited 日本 and a café.",
    "Hello world, hello tokenizer!", "The quick brown fox jumps over the lazy dog.",
] * 3
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXTS = [
    "", "Hello world", "A café in 日本, then 東京 and 京都 🙂👍🏽!", "  two  spaces\n\nand a tab\t.",
    "special <|eot_id|> and <|im_end|> inside text", "The quick brown fox jumps over the lazy dog.",
]

# Llama-3-like: BOS from the template, headers, a default-free system turn, raise_exception.
# Block tags on their own indented lines: the output is only right with trim_blocks and
# lstrip_blocks.
LLAMA_TEMPLATE = """{{ bos_token }}{% if messages[0]['role'] == 'system' %}
    {% set system_message = messages[0]['content'] | trim %}
    {% set messages = messages[1:] %}
{% else %}
    {% set system_message = '' %}
{% endif %}
{% if system_message %}
<|start_header_id|>system<|end_header_id|>

{{ system_message }}<|eot_id|>{% endif %}
{% for message in messages %}
    {% if message['role'] not in ['user', 'assistant'] %}
        {{ raise_exception('roles must be user or assistant, got ' + message['role']) }}
    {% endif %}
<|start_header_id|>{{ message['role'] }}<|end_header_id|>

{{ message['content'] | trim }}<|eot_id|>{% endfor %}
{% if add_generation_prompt %}
<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# ChatML-like (Qwen): default system prompt, tools as JSON lines, a namespace counter,
# loop controls, a {% generation %} block and an enable_thinking switch.
CHATML_TEMPLATE = """{% if tools %}
<|im_start|>system
{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You are a helpful assistant.' }}

# Tools
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools><|im_end|>
{% elif messages[0]['role'] != 'system' %}
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}
{% set ns = namespace(turns=0) %}
{% for message in messages %}
    {% if message['role'] == 'system' and (tools or not loop.first) %}{% continue %}{% endif %}
    {% set ns.turns = ns.turns + 1 %}
<|im_start|>{{ message['role'] }}
{% if message['role'] == 'assistant' %}
{% generation %}{{ message['content'] }}{% endgeneration %}<|im_end|>
{% else %}
{{ message['content'] }}<|im_end|>
{% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}
<think>

</think>

{% endif %}
{% endif %}"""

CHATS = [
    [{"role": "user", "content": "Bonjour, un café ?"}],
    [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "日本の首都は？"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello! 🙂"}, {"role": "user", "content": "And 東京?"}],
]
TOOLS = [{"type": "function", "function": {
    "name": "find_café", "description": "Finds a café <near> & 'open'",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def _write_json(path, data):
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """{"llama": dir, "qwen": dir} sharing one trained byte-level BPE."""
    backend = byte_bpe(CORPUS, 400, LLAMA_SPECIAL + QWEN_SPECIAL, min_frequency=2)
    ids = {t: backend.token_to_id(t) for t in LLAMA_SPECIAL + QWEN_SPECIAL}
    root = tmp_path_factory.mktemp("tokenizers")

    llama = root / "llama"
    llama.mkdir()
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
        special_tokens=[("<|begin_of_text|>", ids["<|begin_of_text|>"])])
    backend.save(str(llama / "tokenizer.json"))
    _write_json(llama / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": LLAMA_TEMPLATE,
        "bos_token": {"__type": "AddedToken", "content": "<|begin_of_text|>", "lstrip": False, "rstrip": False,
                      "normalized": False, "single_word": False, "special": True},
        "eos_token": "<|eot_id|>"})
    _write_json(llama / "generation_config.json", {"bos_token_id": ids["<|begin_of_text|>"],
                                                   "eos_token_id": [ids["<|end_of_text|>"], ids["<|eot_id|>"]]})
    _write_json(llama / "config.json", {"eos_token_id": ids["<|start_header_id|>"]})  # shadowed

    qwen = root / "qwen"
    qwen.mkdir()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    backend.save(str(qwen / "tokenizer.json"))
    _write_json(qwen / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>"})
    (qwen / "chat_template.jinja").write_text(CHATML_TEMPLATE, encoding="utf-8")
    _write_json(qwen / "config.json", {"eos_token_id": ids["<|endoftext|>"]})
    return {"llama": llama, "qwen": qwen, "ids": ids}


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    return lambda path: transformers.AutoTokenizer.from_pretrained(str(path))


# ---- against transformers ---------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "qwen"])
def test_encode_decode_match_transformers(dirs, hf, family):
    ours, theirs = Tokenizer.from_dir(dirs[family]), hf(dirs[family])
    for text in TEXTS:
        for add in (True, False):
            ids = ours.encode(text, add_special_tokens=add)
            assert ids == theirs.encode(text, add_special_tokens=add), (text, add)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert ours.encode("café")[0] == (ours.bos_id if family == "llama" else ours.encode("café", False)[0])
    assert ours.decode(ours.encode(TEXTS[2])) == TEXTS[2]  # byte-level: lossless


@pytest.mark.parametrize("family", ["llama", "qwen"])
def test_chat_template_matches_transformers(dirs, hf, family):
    ours, theirs = Tokenizer.from_dir(dirs[family]), hf(dirs[family])
    for chat in CHATS:
        for add in (True, False):
            text = ours.apply_chat_template(chat, add_generation_prompt=add)
            assert text == theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=add), text
        expected = theirs.apply_chat_template(chat, tokenize=True, add_generation_prompt=True)
        assert ours.encode_chat(chat) == list(getattr(expected, "input_ids", expected))
    if family == "llama":
        assert text.startswith("<|begin_of_text|>") and ours.encode_chat(CHATS[0]).count(ours.bos_id) == 1
    else:  # tools through tojson (non-ASCII and <, &, ' kept as is), an extra template variable
        for kwargs in ({"tools": TOOLS}, {"enable_thinking": False}):
            text = ours.apply_chat_template(CHATS[2], **kwargs)
            assert text == theirs.apply_chat_template(CHATS[2], tokenize=False, add_generation_prompt=True,
                                                      **kwargs)
        assert '"find_café"' in ours.apply_chat_template(CHATS[0], tools=TOOLS)
        assert text.endswith("<think>\n\n</think>\n\n")


def test_special_ids(dirs):
    ids = dirs["ids"]
    llama = Tokenizer.from_dir(dirs["llama"])
    # generation_config.json wins over config.json; the eos_token joins the set once
    assert llama.eos_ids == (ids["<|end_of_text|>"], ids["<|eot_id|>"])
    assert llama.bos_id == ids["<|begin_of_text|>"]
    assert llama.special_tokens == {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    qwen = Tokenizer.from_dir(str(dirs["qwen"]))
    assert qwen.eos_ids == (ids["<|endoftext|>"], ids["<|im_end|>"]) and qwen.bos_id is None
    assert qwen.vocab_size == llama.vocab_size == llama.backend.get_vocab_size()


# ---- streaming --------------------------------------------------------------------------------

@pytest.mark.parametrize("skip", [True, False])
def test_incremental_decoder_matches_one_decode(dirs, skip):
    tok = Tokenizer.from_dir(dirs["llama"])
    ids = tok.encode(TEXTS[2] + "<|eot_id|>" + TEXTS[3])
    stream = IncrementalDecoder(tok, skip_special_tokens=skip)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) + stream.flush() == tok.decode(ids, skip_special_tokens=skip)
    assert not any("\ufffd" in p for p in pieces)
    assert "" in pieces[1:]  # some character did arrive split across tokens (東, 🙂 are raw bytes here)
    # several ids per push, and chunk boundaries anywhere
    stream = IncrementalDecoder(tok, skip_special_tokens=skip)
    chunks = [stream.push(ids[i:i + 3]) for i in range(0, len(ids), 3)]
    assert "".join(chunks) + stream.flush() == tok.decode(ids, skip_special_tokens=skip)


def test_incremental_decoder_holds_partial_characters(dirs):
    tok = Tokenizer.from_dir(dirs["qwen"])
    emoji = tok.encode("🙂", add_special_tokens=False)
    assert len(emoji) > 1  # 4 bytes, no merges learned for them
    stream = IncrementalDecoder(tok)
    assert stream.push(tok.encode("ok ", add_special_tokens=False)) == "ok "
    assert [stream.push(i) for i in emoji[:-1]] == [""] * (len(emoji) - 1)
    assert stream.push(emoji[-1]) == "🙂"
    stream.push(emoji[:-1])
    assert stream.flush() == tok.decode(emoji[:-1]) and stream.flush() == ""  # what is left, once


def test_incremental_decoder_keeps_sentencepiece_spaces():
    # Llama-2 style: "▁" marks a space, characters outside the vocab fall back to <0xNN>
    # byte tokens, and the decoder strips one leading space. Decoding "▁c" alone gives "c";
    # in the stream it must stay " c".
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ["▁", *string.ascii_letters, *".,!?é", "▁c"]:
        vocab[piece] = len(vocab)
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=[("▁", "c")], unk_token="<unk>", byte_fallback=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    backend.add_special_tokens(["<s>", "</s>"])
    tok = Tokenizer(backend)
    ids = tok.encode("Hello café 日本 🙂 ok.")
    assert tok.decode([vocab["▁c"]]) == "c"
    stream = IncrementalDecoder(tok)
    pieces = [stream.push(i) for i in ids]
    assert " c" in pieces and "日" in pieces and "" in pieces
    assert "".join(pieces) + stream.flush() == tok.decode(ids) == "Hello café 日本 🙂 ok."


# ---- errors and the sandbox -------------------------------------------------------------------

def test_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer.from_dir(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=rf"no tokenizer.json in '{tmp_path}'"):
        Tokenizer.from_dir(tmp_path)


def _copy_backend(src, dst, config):
    dst.mkdir()
    (dst / "tokenizer.json").write_bytes((src / "tokenizer.json").read_bytes())
    _write_json(dst / "tokenizer_config.json", config)
    return dst


def test_chat_template_errors(dirs, tmp_path):
    bare = Tokenizer.from_dir(_copy_backend(dirs["llama"], tmp_path / "bare", {"eos_token": "<|eot_id|>"}))
    with pytest.raises(ValueError, match=rf"tokenizer in '{tmp_path / 'bare'}' has no chat template"):
        bare.apply_chat_template(CHATS[0])
    assert bare.apply_chat_template(CHATS[0], template="{{ messages[0]['content'] }}") == CHATS[0][0]["content"]

    llama = Tokenizer.from_dir(dirs["llama"])
    with pytest.raises(jinja2.TemplateError, match="roles must be user or assistant, got tool"):
        llama.apply_chat_template([{"role": "tool", "content": "42"}])
    with pytest.raises(TypeError, match=r"messages\[0\] must be a dict"):
        llama.apply_chat_template(["hi"])
    # the sandbox: no Python internals, no mutating the caller's data
    for escape in ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "{{ messages.append(1) }}"):
        with pytest.raises(jinja2.exceptions.SecurityError):
            llama.apply_chat_template(CHATS[0], template=escape)

    named = [{"name": "tool_use", "template": "tools:{{ tools | length }}"}, {"name": "plain", "template": "plain"}]
    multi = Tokenizer.from_dir(_copy_backend(dirs["llama"], tmp_path / "multi", {"chat_template": named}))
    with pytest.raises(ValueError, match=r"chat templates \['plain', 'tool_use'\] and none is named 'default'"):
        multi.apply_chat_template(CHATS[0])
    assert multi.apply_chat_template(CHATS[0], template="plain") == "plain"
    assert multi.apply_chat_template(CHATS[0], tools=TOOLS) == "tools:1"

    bad = _copy_backend(dirs["llama"], tmp_path / "bad", {})
    _write_json(bad / "generation_config.json", {"eos_token_id": "<|eot_id|>"})
    with pytest.raises(ValueError, match="eos_token_id in .* must be an int or a list of ints"):
        Tokenizer.from_dir(bad)


def test_add_bos_token_without_post_processor(dirs, tmp_path):
    # tokenizer.json with no post-processor: the config's add_bos_token decides.
    backend = BackendTokenizer.from_file(str(dirs["qwen"] / "tokenizer.json"))
    backend.post_processor = None
    path = tmp_path / "bos"
    path.mkdir()
    backend.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {"bos_token": "<|begin_of_text|>", "add_bos_token": True})
    tok = Tokenizer.from_dir(path)
    assert tok.encode("hi") == [tok.bos_id] + tok.encode("hi", add_special_tokens=False)
