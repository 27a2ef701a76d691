"""Tiny tokenizers the fixture writers share: wordpiece, byte-level (with end-of-text variants)
and unigram, over a fixed English word list, each built with the `tokenizers` library."""

from __future__ import annotations

from typing import Any

# A fixed English word list, so that test texts tokenize to whole known pieces.
WORDS = (
    "the a an is are was were be been of and or but to in on at by for with from as it this that "
    "these those i you he she we they me my your his her our their what where who when why how "
    "not no yes very good great bad terrible awful excellent love hate like movie film book food "
    "service price product quality fast slow happy sad angry john mary smith alice bob paris "
    "london berlin new york city france germany england europe google apple microsoft works "
    "lives lived visited born company capital river house car dog cat today tomorrow yesterday "
    "morning night day week year time people person world country street road school university "
    "doctor teacher said says went go going come came see saw think know want need help thanks "
    "please hello question answer query document relevant about which there here some all any "
    "many much more most other such only also just than then so if because while over under "
    "cafe resume naive"
).split()

_PUNCT = list(".,!?;:'\"()-/&%$#@+*=<>[]{}_")
_EXTRA_CHARS = list("éèàüöçñ中文日本語")


def wordpiece_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = [*"abcdefghijklmnopqrstuvwxyz0123456789", *_PUNCT, *_EXTRA_CHARS]
    pieces = [
        *specials,
        *WORDS,
        *chars,
        *("##" + c for c in "abcdefghijklmnopqrstuvwxyz0123456789"),
        *("##s", "##ed", "##ing", "##ly", "##er"),
    ]
    vocab = {piece: i for i, piece in enumerate(dict.fromkeys(pieces))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(specials)
    ids = {name: vocab[name] for name in specials}
    return tok, len(vocab), {"pad": ids["[PAD]"], "cls": ids["[CLS]"], "sep": ids["[SEP]"]}


def bytelevel_tokenizer() -> Any:
    """Byte-level BPE; merges spell each word (and each word after a space) left to right.

    The merges are written, not trained, so the file is byte-for-byte reproducible. Merges of
    words after a space rank first, so those always come out whole; a text's first word may
    split into pieces, as with any BPE.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab: dict[str, int] = {c: i for i, c in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    for form in sorted(
        {w for word in WORDS for w in (word, "Ġ" + word)}, key=lambda f: (f[0] != "Ġ", len(f), f)
    ):
        for i in range(1, len(form)):
            left, right = form[:i], form[i]
            if form[: i + 1] not in vocab:
                vocab[form[: i + 1]] = len(vocab)
                merges.append((left, right))
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    for name in specials:
        vocab[name] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    return tok, len(vocab), {"pad": vocab["[PAD]"], "cls": vocab["[CLS]"], "sep": vocab["[SEP]"]}


def bytelevel_eot_tokenizer() -> Any:
    """The byte-level BPE as a decoder's tokenizer: no token in front, and `<|endoftext|>`
    appended to each text, as Qwen3-Embedding's tokenizer.json post-processor does. Its pad
    token is another one ([PAD]): a *ForSequenceClassification reference skips trailing pad
    tokens, so an appended token that doubled as the pad would not be the one it scores."""
    from tokenizers import processors

    tok, _, ids = bytelevel_tokenizer()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    eot, eos = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>",
        pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
        special_tokens=[("<|endoftext|>", eot)],
    )
    return tok, tok.get_vocab_size(with_added_tokens=True), {"pad": ids["pad"], "cls": eot, "sep": eos}


def bytelevel_eot_pad_tokenizer() -> Any:
    """`bytelevel_eot_tokenizer` with Qwen's pad token: `<|endoftext|>`, the very token it
    appends, so every text ends in the pad id (a *ForSequenceClassification reference scores
    the token before it)."""
    tok, vocab_size, ids = bytelevel_eot_tokenizer()
    return tok, vocab_size, {**ids, "pad": ids["cls"]}


def unigram_tokenizer() -> Any:
    """A SentencePiece-style Unigram model (Metaspace, cased), like mmBERT's Gemma tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    pieces: list[tuple[str, float]] = [(s, 0.0) for s in specials]
    seen = set(specials)
    for word in WORDS:
        for piece in ("▁" + word, "▁" + word.capitalize()):
            if piece not in seen:
                seen.add(piece)
                pieces.append((piece, -4.0 - 0.01 * len(piece)))
    for c in ["▁", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", *_PUNCT, *_EXTRA_CHARS]:
        if c not in seen:
            seen.add(c)
            pieces.append((c, -10.0))
    tok = Tokenizer(models.Unigram(pieces, unk_id=specials.index("<unk>"), byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>",
        pair="<bos> $A <eos> $B <eos>",
        special_tokens=[("<bos>", 2), ("<eos>", 1)],
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.add_special_tokens(specials)
    return tok, len(pieces), {"pad": 0, "cls": 2, "sep": 1}


# The tokenizer kinds a Fixture names, as (tokenizer, vocabulary size, special ids) builders.
TOKENIZERS = {
    "wordpiece": wordpiece_tokenizer,
    "bytelevel": bytelevel_tokenizer,
    "bytelevel_eot": bytelevel_eot_tokenizer,
    "bytelevel_eot_pad": bytelevel_eot_pad_tokenizer,
    "unigram": unigram_tokenizer,
}
