"""The embedded `tiny` model: a ~2M-parameter Qwen3 causal LM built in code, no hub needed.

- tokenizer: byte-level BPE (digits split one by one, as Qwen does) trained with
  the `tokenizers` library on a small corpus generated here (English words,
  numbers, JSON, tool-call turns), plus ChatML special tokens ``<|im_start|>``,
  ``<|im_end|>``, ``<|endoftext|>`` and the tool-use tokens ``<think>``,
  ``</think>``, ``<tool_call>``, ``</tool_call>``, ``<tool_response>``,
  ``</tool_response>`` (added tokens, not "special": decoding keeps them, as
  Qwen's tokenizer does), and the single-token strings that installed packages
  register in `TOKEN_SETS` (mars: one token per board-game action);
- model: `Qwen3ForCausalLM`, random-initialized from ``seed`` (same seed, same
  weights; the tokenizer does not depend on the seed);
- the project's chat template (`chat_template.jinja`).

`load_tiny(seed)` builds it once (about 1-2 s) and caches it as an HF directory
under ``$PALAESTRA_CACHE`` (default ``~/.cache/palaestra``), keyed by seed and
`TINY_VERSION` and the registered token sets; later calls load the cache.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from palaestra.shared.registry import Registry

TINY_VERSION = "3"
"""Bump when the corpus, tokenizer or architecture changes (invalidates the cache)."""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
TOKEN_SETS: Registry[Callable[[], list[str]]] = Registry("tiny token set", "palaestra.tiny_tokens")
"""Strings a package wants as single tokens of `tiny` (name -> function returning them). A multi-token
string can make copying it an in-context lookup that a random-init 2M model does not learn in a CPU budget."""


def extra_tokens() -> list[str]:
    """The registered token sets, in name order, without repeats."""
    tokens: list[str] = []
    for name in sorted(TOKEN_SETS.names()):
        tokens += [t for t in TOKEN_SETS.get(name)() if t not in tokens]
    return tokens


VOCAB_SIZE = 2048
CONTEXT_LENGTH = 4096

_WORDS = """
the of and to a in is it you that he was for on are with as I his they be at one have this from or had by hot
word but what some we can out other were all there when up use your how said an each she which do their time if
will way about many then them write would like so these her long make thing see him two has look more day could go
come did number sound no most people my over know water than call first who may down side been now find any new
work part take get place made live where after back little only round man year came show every good me give our
under name very through just form sentence great think say help low line differ turn cause much mean before move
right boy old too same tell does set three want air well also play small end put home read hand port large spell
add even land here must big high such follow act why ask men change went light kind off need house picture try us
again animal point mother world near build self earth father head stand own page should country found answer
school grow study still learn plant cover food sun four between state keep eye never last let thought city tree
cross farm hard start might story saw far sea draw left late run while press close night real life few north
weather search file message ticket flight book hotel price stock order user account email send list create delete
update get set read write open close move copy find sort count sum average add subtract multiply divide result
value name id date status error true false null query location temperature unit celsius fahrenheit Paris London
Tokyo France England Japan capital city answer question player game move win lose draw board action legal
""".split()  # noqa: SIM905  (a word list reads better as prose)
_FUNCS = [
    "get_weather",
    "search_files",
    "send_message",
    "book_flight",
    "get_stock_price",
    "add",
    "multiply",
    "create_ticket",
    "list_directory",
    "cd",
    "ls",
    "cat",
    "mkdir",
    "sort",
    "calculate",
    "play_move",
]


def cache_dir() -> Path:
    return Path(os.environ.get("PALAESTRA_CACHE", Path.home() / ".cache" / "palaestra"))


def build_corpus(seed: int = 0, lines: int = 3000) -> list[str]:
    """Deterministic training text for the tokenizer: prose, numbers, JSON and tool-call turns."""
    import json

    rng = random.Random(seed)
    corpus = [" ".join(_WORDS[i : i + 12]) for i in range(0, len(_WORDS), 12)]
    for _ in range(lines):
        kind = rng.randrange(4)
        words = rng.choices(_WORDS, k=rng.randint(3, 14))
        if kind == 0:
            corpus.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ","]))
        elif kind == 1:
            corpus.append(
                f"{rng.randint(0, 10 ** rng.randint(1, 6))} {rng.choice(['+', '-', '*', '/', '='])} "
                f"{rng.uniform(-1000, 1000):.{rng.randint(0, 3)}f}"
            )
        else:
            args = {
                w: rng.choice([rng.randint(0, 999), w.upper(), rng.random() < 0.5, [1, 2], None])
                for w in rng.sample(_WORDS, rng.randint(1, 3))
            }
            call = json.dumps({"name": rng.choice(_FUNCS), "arguments": args})
            if kind == 2:
                corpus.append(
                    f"<|im_start|>assistant\n<think>{' '.join(words)}</think>\n"
                    f"<tool_call>\n{call}\n</tool_call><|im_end|>"
                )
            else:
                corpus.append(f"<|im_start|>user\n<tool_response>\n{json.dumps(args)}\n</tool_response><|im_end|>")
    return corpus


def build_tokenizer():
    """A `PreTrainedTokenizerFast`: byte-level BPE trained on `build_corpus()`, with the chat template.

    The same for every seed, so that tiny models of different seeds share one vocabulary (weights can move
    between them)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    extra = extra_tokens()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TOOL_TOKENS) - len(extra),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(build_corpus(), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS + extra])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        chat_template=chat_template(),
        model_max_length=CONTEXT_LENGTH,
    )


def chat_template() -> str:
    """The project's tool-aware ChatML template (also given to smollm2-135m)."""
    return (Path(__file__).parent / "chat_template.jinja").read_text()


def build_tiny(seed: int = 0, tokenizer=None):
    """(model, tokenizer): a random-initialized Qwen3 of about 2M parameters (tokenizer built unless given)."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = tokenizer or build_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=CONTEXT_LENGTH,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
    )
    return model.eval(), tokenizer


def tiny_path(seed: int = 0) -> Path:
    """The cached HF directory of `tiny` for `seed`, built on first use."""
    extra = extra_tokens()
    digest = f"-t{hashlib.sha1(chr(0).join(extra).encode()).hexdigest()[:8]}" if extra else ""
    path = cache_dir() / f"tiny-v{TINY_VERSION}{digest}-seed{seed}"
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return path
    model, tokenizer = build_tiny(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    # build in a temp dir and rename, so concurrent processes (Ray workers) never read a half-written cache
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=path.name + ".tmp"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(path)
    except OSError:  # another process won the race; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return path
