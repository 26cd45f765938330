# Generates vocab-cases.json: llama.cpp's own ids for 200 varied texts on each
# vocabulary of models/vocab/ (fetched by .ci/fetch-vocab), which
# runtime/src/tokenizer/vocab_tests.rs compares against exactly. Not run by CI.
#
# llama.cpp tokenizes through llama-tokenize-batch.c (beside this script), a
# small program over libllama's public API: llama_tokenize with add_special and
# parse_special off (as llama.cpp's test-tokenizer-0), and the ids' pieces
# (llama_token_to_piece, special off) joined; and, for the texts with `<`, `[`
# or `▁` (special-token-looking), the ids with parse_special on. Build it against the llama.cpp
# checkout of the pinned llama-cpp-python sdist (vendor/llama.cpp), e.g.:
#
#   cmake -S $LLAMA -B $LLAMA/build -DLLAMA_CURL=OFF && cmake --build $LLAMA/build --target llama
#   cc -O1 -o llama-tokenize-batch llama-tokenize-batch.c -I$LLAMA/include -I$LLAMA/ggml/include \
#      -L$LLAMA/build/bin -lllama -Wl,-rpath,$LLAMA/build/bin
#   python3 vocab-cases.py ./llama-tokenize-batch ../../../../models/vocab vocab-cases.json
import json, random, struct, subprocess, sys

VOCABS = ["llama-bpe", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder", "gpt-2", "mpt", "starcoder", "refact",
          "llama-spm", "phi-3"]

texts = [
    "Hello world", "Hello, world!", " leading space", "trailing space ", "  two leading", "   three leading",
    "a  b   c    d", "tab\there", "\t\tindented\n\t\tcode", "line1\nline2\r\nline3\n\n\nend", "\r\n\r\n", "\r", "x\r\ny",
    "   ", "\n", "\n\n", " \n ", "x\n\n  y", "a \t b  ", "\t", " \t\n", "\u000b\u000c vertical tab and form feed",
    "12345", "3.14159", "1,000,000", "in 2024!", "v1.25 is", "0x7f 0b1010 1e-5", "٣٤٥ ⅷ ²³ ½", "1234567890123456789012345",
    "00000000", "9.99e+307", "-42", "+1 (555) 123-4567", "2026-11-28T20:35:01Z", "IPv4 192.168.0.1",
    "I'm, you're, they've, we'll, she'd, it's, DON'T, 'quoted'", "don't", "it''s", "I'M WE'LL THEY'RE", "'s 'S 'Ll",
    "Здравствуй, мир!", "你好，世界。", "こんにちは、世界", "カタカナとひらがな", "안녕하세요", "مرحبا بالعالم", "שלום עולם",
    "Ελληνικά", "हिन्दी", "தமிழ்", "ภาษาไทย", "ქართული", "Հայերեն", "ᏣᎳᎩ", "𐐀𐐨 Deseret", "Tiếng Việt có dấu",
    "emoji 🙂👍🏽 👨‍👩‍👧 🇫🇷 ❤️", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "café naïve résumé", "Straße", "ﬁ ligature", "e\u0301 combining acute",
    "a\u0300\u0301\u0302\u0303 stacked marks", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇", "\u00a0nbsp\u2009thin\u3000ideographic", "\u200bzero\u200cwidth\u200d",
    "\ufeffbom", "\u2028line sep\u2029para sep", "\u0085next line", "mixed ABC abc ÀÉÎ àéî", "ǅ ǈ ǋ titlecase",
    "CamelCaseIdentifier snake_case_name kebab-case SCREAMING_CASE",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n", "def f(x):\n    return x**2  # square\n",
    "<html><body class=\"x\">Hi</body></html>", "SELECT * FROM t WHERE a >= 10;", "$$E=mc^2$$", "C++ && C# || F#",
    "#include <stdio.h>\nint main(void) { return 0; }\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "let x: Vec<u8> = vec![0; 16];", "{\"key\": [1, 2.5, null, true], \"s\": \"\\u00e9\"}", "```python\nprint('hi')\n```",
    "https://example.com/path?q=1&r=2#frag", "user@example.com", "!!!???...---", "((([[[{{{", "}}}]]])))", "~`^|\\",
    "<|im_start|>user\nHi<|im_end|>", "<|endoftext|>", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>",
    "<s>[INST] hi [/INST]</s>", "</s>  after eos", "<unk> <s> </s>", "<|user|>\nQ<|end|>\n<|assistant|>", "<0x0A> <0xFF>",
    "<|eot_id|>", "<｜begin▁of▁sentence｜>", "▁leading▁marker", "▁", "▁▁ ▁", " ▁ ",
    " " * 40, "a" + " " * 100 + "b", "\n" * 20, "\t" * 12 + "x", " \n" * 10, "." * 50, "-" * 80, "=" * 33,
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "abcabcabcabcabcabc", "supercalifragilisticexpialidocious",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore.",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!", "Ünïcödé Ŝţřïñğ", "ÅÄÖ åäö ØÆ øæ",
    "\x00\x01\x02 controls \x7f", "a\x04b \U00040000", "tab\tsep\tvalues\t1\t2", "trailing newline\n", "\nleading newline",
    "   \n   \n", "Mr. Smith's 3rd car—the red one—costs $12,345.67 (approx.)", "50% off… “quoted” ‘single’ «guillemets»",
    "∀x ∈ ℝ: x² ≥ 0 ∧ √4 = 2", "→ ← ↑ ↓ ⇒ ⇔", "♠♥♦♣ ★☆ ✓✗", "¡Hola! ¿Qué tal?", "日本語のテキストと English mixed 123",
    "中文，标点！还有数字１２３和全角ＡＢＣ", "한국어와 English 섞기", "Привет, как дела? Всё хорошо.",
]
# Long runs (regex backtracking) and repetition.
texts += [" " * 3000 + "x", "a" + " \t" * 100 + "\n", "word " * 60, "1" * 120, "🙂" * 30]
rng = random.Random(39)
pool = list("abcdefghijklmnopqrstuvwxyz ABCXYZ 0123456789 \t\n\n  .,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`") + \
    list("éüßñçøåλπΩжщ中文日本語한국어ÿ€™°±√∞≈≠") + \
    ["🙂", "👍🏽", "🇫🇷", "\u0301", "'s", "'ll", "  ", "\r\n", "٣", "Ⅻ", "¼", "▁", "<s>", "</s>", "<|", "|>", "\u3000"]
while len(texts) < 200:
    texts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 40))))
assert len(texts) == 200 and len(set(texts)) == 200, len(set(texts))

tool, vocab_dir, out_path = sys.argv[1:4]
stdin = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
special_texts = [i for i, t in enumerate(texts) if any(c in t for c in "<[\u2581")]
special_stdin = b"".join(struct.pack("<I", len(texts[i].encode())) + texts[i].encode() for i in special_texts)


def tokenize(vocab, data, n, *flags):
    out = subprocess.run([tool, f"{vocab_dir}/ggml-vocab-{vocab}.gguf", *flags], input=data, capture_output=True,
                         check=True)
    lines = out.stdout.decode().split("\n")
    assert len(lines) == 2 * n + 1, (vocab, len(lines))
    ids = [[int(x) for x in lines[2 * i].split()] for i in range(n)]
    detok = [bytes.fromhex(lines[2 * i + 1]).decode("utf-8", errors="replace") for i in range(n)]
    return ids, detok


result = {}
for v in VOCABS:
    ids, detok = tokenize(v, stdin, len(texts))
    special_ids, _ = tokenize(v, special_stdin, len(special_texts), "--parse-special")
    result[v] = (ids, detok, special_ids)

with open(out_path, "w") as f:
    # One text or id list per line: readable diffs.
    meta = {
        "producer": "llama.cpp of llama-cpp-python 0.3.36 (vendor/llama.cpp), vocab_only, llama_tokenize(add_special=false, parse_special=false); detok: llama_token_to_piece(lstrip=0, special=false) of the ids, joined, UTF-8 with errors replaced; listed only where it differs from the text; parse_special_ids: llama_tokenize(add_special=false, parse_special=true) of the texts with '<', '[' or U+2581, by text index",
    }
    f.write(json.dumps(meta, ensure_ascii=False)[:-1] + ',\n"texts": [\n')
    f.write(",\n".join(json.dumps(t, ensure_ascii=False) for t in texts))
    f.write("\n],\n\"vocabs\": {\n")
    parts = []
    for v in VOCABS:
        ids, detok, special_ids = result[v]
        diff = {str(i): d for i, d in enumerate(detok) if d != texts[i]}
        special = ",\n".join(f'"{i}": {json.dumps(x)}' for i, x in zip(special_texts, special_ids))
        parts.append(json.dumps(v) + ': {"ids": [\n' + ",\n".join(json.dumps(x) for x in ids) + "\n],\n\"detok\": "
                     + json.dumps(diff, ensure_ascii=False) + ',\n"parse_special_ids": {\n' + special + "\n}}")
    f.write(",\n".join(parts))
    f.write("\n}}\n")
print(len(texts), "texts,", len(VOCABS), "vocabularies")
