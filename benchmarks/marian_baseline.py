"""The peer of the 25-minute Multi30k comparison: transformers' MarianMTModel at the paper's small sizes, trained by
`Seq2SeqTrainer` for a wall-clock budget on this machine, as a transformers user would train it.

    python benchmarks/marian_baseline.py --budget_min 25                  # Multi30k EN-DE from ../shared/data
    python benchmarks/marian_baseline.py --data DIR --budget_min 25 --out runs/marian

`benchmarks/multi30k.py` runs it beside our recipe. DIR holds train, valid and test2016, each as NAME.en + NAME.de.
The recipe: a joint byte-level BPE of 8,000 (tokenizers, pairs of frequency >= 2); d_model 256, 3 + 3 layers, 4
heads, d_ff 1024, one embedding matrix for source, target and the output, dropout 0.1; Adam(0.9, 0.98, 1e-9), lr
1e-3 with 1,000 warmup steps and transformers' inverse square root decay, label smoothing 0.1, 128 pairs a batch
grouped by length; stopped at the first step after the budget. Then the teacher-forced NLL of valid and test2016,
and their translations with transformers' beam search (beam 4, its length penalty 0.6, at most source length + 50)
and greedy test2016, scored by sacreBLEU and chrF. OUT/results.json keeps it all; OUT/SPLIT_beamN.hyp.de the
translations; OUT/model and OUT/tokenizer the trained model (for `benchmarks/fit_gap.py --peer OUT`).
"""

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import datasets
import torch
from sacrebleu.metrics import BLEU, CHRF
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    DataCollatorForSeq2Seq,
    MarianConfig,
    MarianMTModel,
    PreTrainedTokenizerFast,
    PrinterCallback,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    set_seed,
)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vaswani_hf.speed.kernels import cpu_name, usable_cores
from vaswani_hf.tools.text import read_lines

SPLITS, SPECIALS, MAX_LENGTH, BATCH = ("train", "valid", "test2016"), ["<pad>", "</s>", "<unk>"], 128, 128


def byte_level_bpe(texts: list[str]) -> PreTrainedTokenizerFast:
    """A joint byte-level BPE of 8,000 over both sides; every encoding ends with </s>."""
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=8000, min_frequency=2, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    eos = ("</s>", bpe.token_to_id("</s>"))
    bpe.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[eos])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def small_marian(tokenizer) -> MarianMTModel:
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    return MarianMTModel(MarianConfig(
        vocab_size=len(tokenizer), decoder_vocab_size=len(tokenizer), d_model=256, encoder_layers=3, decoder_layers=3,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
        activation_function="relu", scale_embedding=True, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
        max_position_embeddings=256, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        pad_token_id=pad, eos_token_id=eos, decoder_start_token_id=pad, forced_eos_token_id=eos, init_std=0.02))


class Budget(TrainerCallback):
    """Stops training at the first step that ends after `seconds`; keeps the logged losses."""

    def __init__(self, seconds: float):
        self.seconds, self.log = seconds, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.time()

    def on_step_end(self, args, state, control, **kwargs):
        self.elapsed = time.time() - self.start
        control.should_training_stop = self.elapsed >= self.seconds

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.log.append({"step": state.global_step, "elapsed_s": round(time.time() - self.start, 1), **(logs or {})})
        print(json.dumps(self.log[-1]), flush=True)


@torch.inference_mode()
def nll(model, collator, pairs) -> float:
    """Teacher-forced NLL per target token."""
    total = count = 0.0
    for start in range(0, len(pairs), BATCH):
        batch = collator(pairs[start:start + BATCH])
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="sum",
                                                   ignore_index=-100).item()
        count += batch["labels"].ne(-100).sum().item()
    return total / count


@torch.inference_mode()
def translate(model, tokenizer, sources: list[str], num_beams: int) -> list[str]:
    """transformers' beam search (length penalty 0.6) or greedy, in batches of sources of like length."""
    encoded = tokenizer(sources, truncation=True, max_length=MAX_LENGTH)["input_ids"]
    order = sorted(range(len(sources)), key=lambda i: len(encoded[i]))
    found = [""] * len(sources)
    for start in range(0, len(order), 64):
        rows = order[start:start + 64]
        batch = tokenizer.pad({"input_ids": [encoded[i] for i in rows]}, return_tensors="pt")
        output = model.generate(**batch, num_beams=num_beams, do_sample=False,
                                length_penalty=0.6 if num_beams > 1 else 1.0, bad_words_ids=[[tokenizer.pad_token_id]],
                                max_new_tokens=batch["input_ids"].shape[1] + 50)
        for i, text in zip(rows, tokenizer.batch_decode(output, skip_special_tokens=True)):
            found[i] = text.strip()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "marian-run")
    parser.add_argument("--budget_min", type=float, default=25.0)
    parser.add_argument("--eval_limit", type=int, help="score only the first N sentences of each split (a smoke test)")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(usable_cores())
    set_seed(args.seed)
    data = {split: (read_lines(args.data / f"{split}.en"), read_lines(args.data / f"{split}.de")) for split in SPLITS}

    tokenizer = byte_level_bpe(data["train"][0] + data["train"][1])
    encoded = {split: [{"input_ids": s, "attention_mask": [1] * len(s), "labels": t} for s, t in zip(
        *(tokenizer(side, truncation=True, max_length=MAX_LENGTH)["input_ids"] for side in data[split]))]
        for split in SPLITS}
    train = datasets.Dataset.from_list([{**pair, "length": max(len(pair["input_ids"]), len(pair["labels"]))}
                                        for pair in encoded["train"]])
    model = small_marian(tokenizer)
    budget = Budget(60 * args.budget_min)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    training = Seq2SeqTrainingArguments(
        output_dir=str(args.out / "trainer"), per_device_train_batch_size=BATCH, learning_rate=1e-3,
        lr_scheduler_type="inverse_sqrt", warmup_steps=1000, adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-9,
        weight_decay=0.0, label_smoothing_factor=0.1, train_sampling_strategy="group_by_length",
        length_column_name="length", max_steps=1_000_000, logging_steps=100, logging_first_step=True,
        save_strategy="no", eval_strategy="no", report_to="none", use_cpu=True, seed=args.seed, disable_tqdm=True)
    trainer = Seq2SeqTrainer(model=model, args=training, train_dataset=train, data_collator=collator,
                             processing_class=tokenizer, callbacks=[budget])
    trainer.remove_callback(PrinterCallback)  # Budget prints each log line, with its time
    trainer.train()
    model.eval()
    model.save_pretrained(args.out / "model")
    tokenizer.save_pretrained(args.out / "tokenizer")

    steps = trainer.state.global_step
    results = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "vocabulary": len(tokenizer),
               "parameters": model.num_parameters(),
               "train": {"steps": steps, "seconds": budget.elapsed, "budget_min": args.budget_min, "log": budget.log},
               "eval": {}}
    print(f"trained {steps} steps in {budget.elapsed:.0f} s", flush=True)
    for split in ("valid", "test2016"):
        results["eval"][f"{split}_nll"] = nll(model, collator, encoded[split])
        results["eval"][f"{split}_ppl"] = math.exp(results["eval"][f"{split}_nll"])
    for split, beams in (("test2016", 4), ("valid", 4), ("test2016", 1)):
        sources, references = (side[: args.eval_limit] for side in data[split])
        start = time.time()
        hypotheses = translate(model, tokenizer, sources, beams)
        bleu, chrf = BLEU().corpus_score(hypotheses, [references]), CHRF().corpus_score(hypotheses, [references])
        results["eval"][f"{split}_beam{beams}"] = {"bleu": bleu.score, "chrf": chrf.score, "sentences": len(sources),
                                                   "seconds": time.time() - start}
        (args.out / f"{split}_beam{beams}.hyp.de").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
        print(f"{split}, beam {beams}: {bleu}  chrF {chrf.score:.2f}", flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
