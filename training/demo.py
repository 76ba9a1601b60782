"""A one-minute demo: build a small Transformer, train it on generated English-German sentences, translate.

    python training/demo.py                      # about 50 seconds on 2 CPU cores
    python training/demo.py --steps 50 --output_dir /tmp/demo

Until `training/run.py` (the paper's full recipe) lands, this is the project's main job: it shows the model
end to end with the Hugging Face pieces a user touches — a `tokenizers` tokenizer saved as a fast tokenizer,
`save_pretrained`, `AutoModelForSeq2SeqLM.from_pretrained` and `generate()` with the saved beam-4 settings.

The sentences come from a small grammar written for this project ("the big dog sees a small cat." ->
"der große Hund sieht eine kleine Katze."): German articles and adjective endings follow the noun's gender
and case, so the model has to learn agreement, not just a word list.
"""

import argparse
import itertools
import random
import time

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerFast

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration

# noun: (German, gender); adjective: (stem); verb: German third person singular
NOUNS = {"dog": ("Hund", "m"), "man": ("Mann", "m"), "cat": ("Katze", "f"), "woman": ("Frau", "f"),
         "child": ("Kind", "n"), "house": ("Haus", "n"), "book": ("Buch", "n"), "car": ("Wagen", "m")}
ADJECTIVES = {"big": "groß", "small": "klein", "old": "alt", "new": "neu", "red": "rot", "": None}
VERBS = {"sees": "sieht", "likes": "mag", "finds": "findet", "has": "hat"}
# (article, case, gender) -> German article; adjective ending after the definite / indefinite article
DEFINITE = {("nom", "m"): "der", ("nom", "f"): "die", ("nom", "n"): "das",
            ("acc", "m"): "den", ("acc", "f"): "die", ("acc", "n"): "das"}
INDEFINITE = {("nom", "m"): "ein", ("nom", "f"): "eine", ("nom", "n"): "ein",
              ("acc", "m"): "einen", ("acc", "f"): "eine", ("acc", "n"): "ein"}
WEAK_ENDING = {("nom", "m"): "e", ("nom", "f"): "e", ("nom", "n"): "e", ("acc", "m"): "en", ("acc", "f"): "e", ("acc", "n"): "e"}
MIXED_ENDING = {("nom", "m"): "er", ("nom", "f"): "e", ("nom", "n"): "es", ("acc", "m"): "en", ("acc", "f"): "e", ("acc", "n"): "es"}


def noun_phrase(article: str, adjective: str, noun: str, case: str) -> tuple[str, str]:
    german_noun, gender = NOUNS[noun]
    definite = article == "the"
    german = [(DEFINITE if definite else INDEFINITE)[case, gender]]
    if ADJECTIVES[adjective]:
        german.append(ADJECTIVES[adjective] + (WEAK_ENDING if definite else MIXED_ENDING)[case, gender])
    german.append(german_noun)
    english = [article] + ([adjective] if adjective else []) + [noun]
    return " ".join(english), " ".join(german)


def sentence_pairs() -> list[tuple[str, str]]:
    """Every sentence of the grammar: subject, verb, object."""
    pairs = []
    phrases = list(itertools.product(["the", "a"], ADJECTIVES, NOUNS))
    for (a1, j1, n1), verb, (a2, j2, n2) in itertools.product(phrases, VERBS, phrases):
        subject_en, subject_de = noun_phrase(a1, j1, n1, "nom")
        object_en, object_de = noun_phrase(a2, j2, n2, "acc")
        pairs.append((f"{subject_en} {verb} {object_en} .", f"{subject_de} {VERBS[verb]} {object_de} ."))
    return pairs


def build_tokenizer(pairs: list[tuple[str, str]]) -> PreTrainedTokenizerFast:
    """A joint word-level vocabulary (the paper shares one vocabulary between source and target, §3.4)."""
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    words = sorted({word for pair in pairs for side in pair for word in side.split()})
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(specials + words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token="<unk>")
    return fast


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--output_dir", default="outputs/demo")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    random.seed(args.seed)

    pairs = sentence_pairs()
    random.shuffle(pairs)
    test, train = pairs[:8], pairs[8:]
    tokenizer = build_tokenizer(pairs)
    config = VaswaniConfig(vocab_size=len(tokenizer), d_model=128, d_ff=512, num_heads=4, num_layers=2,
                           pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                           eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.bos_token_id)
    model = VaswaniForConditionalGeneration(config)
    print(f"{len(train)} training pairs, vocabulary {len(tokenizer)}, {model.num_parameters() / 1e6:.2f}M parameters")

    # §5.3: Adam(0.9, 0.98, 1e-9) with warmup then inverse square root decay (warmup shortened for a demo).
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    warmup = 100
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: config.d_model**-0.5 * min((step + 1) ** -0.5, (step + 1) * warmup**-1.5))
    model.train()
    start = time.time()
    for step in range(1, args.steps + 1):
        batch = random.sample(train, 64)
        inputs = tokenizer([en for en, _ in batch], text_target=[de for _, de in batch], padding=True, return_tensors="pt")
        inputs["labels"] = inputs["labels"].masked_fill(inputs["labels"] == tokenizer.pad_token_id, -100)
        loss = model(**inputs).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == args.steps:
            print(f"step {step:4d}  loss {loss.item():.3f}  lr {schedule.get_last_lr()[0]:.2e}  {time.time() - start:.0f}s")

    model.save_pretrained(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    print(f"saved to {args.output_dir}; reloading with AutoModelForSeq2SeqLM / AutoTokenizer")
    model = AutoModelForSeq2SeqLM.from_pretrained(args.output_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.output_dir)
    sources = [en for en, _ in test]
    inputs = tokenizer(sources, padding=True, return_tensors="pt")
    outputs = model.generate(**inputs)  # the saved generation config: beam 4, at most source length + 50
    translations = tokenizer.batch_decode(outputs, skip_special_tokens=True)
    correct = 0
    for (source, reference), translation in zip(test, translations):
        correct += translation == reference
        print(f"{'ok ' if translation == reference else 'XX '} {source}  ->  {translation}")
    print(f"{correct}/{len(test)} held-out sentences translated exactly")


if __name__ == "__main__":
    main()
