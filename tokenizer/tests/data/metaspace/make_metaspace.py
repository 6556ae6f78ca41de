"""Writes first/tokenizer.json and always/tokenizer.json: two small SentencePiece-style BPE
tokenizers (Metaspace pre-tokenizer, byte fallback, ChatML special tokens) trained with
HuggingFace `tokenizers` itself, differing only in `prepend_scheme` ("first": transformers'
non-legacy Llama / Mistral conversions; "always": the legacy ones). Test data for
tokenizer/src/segments.rs: with "first", encoding piece by piece around added tokens is not
the tokenizer's own encoding.

    pip install "tokenizers>=0.20"
    python3 tokenizer/tests/data/metaspace/make_metaspace.py
"""

import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = ["user hello world, the quick brown fox jumps over the lazy dog"] * 50 + [
    "assistant answers politely and precisely about billing"
] * 50
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

for scheme in ["first", "always"]:
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    os.makedirs(os.path.join(HERE, scheme), exist_ok=True)
    tok.save(os.path.join(HERE, scheme, "tokenizer.json"))
