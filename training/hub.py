"""The run's output folder as a Hub model repository: weights, code, tokenizer, metrics and the model card."""

import json
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers import GenerationConfig

from training.recipe import TrainingData
from vaswani_hf.gnmt import EXTRA_OUTPUT_LENGTH, extra_length_of
from vaswani_hf.tools.loading import is_local, one_line_errors, papers_decoding

ROOT = Path(__file__).resolve().parent.parent
MODEL_CARD = ROOT / "model_card.md"

def write_output_folder(model, tokenizer, output_dir: Path, metrics: dict, *, data: TrainingData, length_limit: str,
                        source_lang: str, target_lang: str, model_id: str, recipe: dict, deviations: list[str],
                        label_smoothing: float, batching: str, num_beams: int = 4, alpha: float | None = 0.6,
                        base_model: str | None = None, trees: bool = False) -> None:
    """Weights (safetensors), config with auto_map and custom_pipelines, code files, tokenizer, the generation config
    of the paper's decoding (beam size and GNMT α; `alpha=None`: the model's own, as a converted model's fine-tuning
    keeps the decoding it was published with), metrics, and README.md — the model card with this run's
    numbers. The card states the run's own recipe: its `batching` (how batches were made), its label smoothing, the
    dropout of its config and the checkpoints `metrics` says were averaged; its data as `data` describes it, and
    `length_limit`, what training did with long pairs; `base_model`, the model a fine-tuning run started from (a Hub id
    or a folder here, which the card names without its path); `trees`: a parser's (§6.3), whose outputs are trees."""
    if alpha is not None:  # the run's limit kept
        set_paper_decoding(model.generation_config, num_beams, alpha, extra_length_of(model.generation_config))
    model.save_pretrained(output_dir)
    save_tokenizer(tokenizer, output_dir)
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=1), encoding="utf-8")
    deviations = model.config.deviations() + deviations
    base_id = None if base_model is None or is_local(base_model) else base_model
    if base_model is not None:
        named = base_id or f"the local model folder {Path(base_model).resolve().name}"
        deviations.append(f"recipe: fine-tuned from {named}, its weights and tokenizer, not from the paper's "
                          "initialization")
    averaged = len(metrics.get("averaged_checkpoints", []))
    scores = {split: metrics[split] for split in ("validation", "test") if "bleu" in metrics.get(split, {})}
    values = {
        "source_lang": source_lang,
        "target_lang": target_lang,
        "synthetic_warning": SYNTHETIC_WARNING if data.synthetic else "",
        "data": data.description,
        **(parser_texts(source_lang, data.description) if trees else
           translator_texts(source_lang, target_lang, data.description)),
        "sizes": ", ".join(f"{count:,} {split} pairs" if isinstance(count, int) else f"{split} pairs {count}"
                           for split, count in data.sizes.items()),
        "example": json.dumps(data.example, ensure_ascii=False),
        "length_limit": length_limit,
        "max_input_length": f"{model.config.max_position_embeddings:,}",
        "extra_length": str(extra_length_of(model.generation_config)),
        "model_id": model_id,
        "parameters": f"{model.num_parameters() / 1e6:.1f}M",
        "architecture": architecture_text(model.config),
        "as_published": "As published" + ", except for the deviations below" * bool(model.config.deviations()),
        "batching": batching,
        "dropout": f"{model.config.dropout:.3g}",
        "label_smoothing": f"{label_smoothing:g}",
        "deviations": "\n".join(f"- {d}" for d in deviations) or "- none",
        "steps": f"{metrics.get('train_steps', 0):,}",
        "minutes": f"{metrics.get('train_minutes', 0):.1f}",
        "averaging": (f"the last {averaged} checkpoints averaged" if averaged > 1
                      else "the final weights, not averaged"),
        "recipe": json.dumps(recipe, indent=1),
        "tokenizer": "joint BPE" if base_model is None else "the tokenizer of the model it was fine-tuned from",
        "decoding": decoding_text(model.generation_config, num_beams, alpha),
        "evaluation": evaluation_text(scores, decoding_text(model.generation_config, num_beams, alpha, short=True),
                                      trees),
    }
    metadata = card_metadata(data, scores, source_lang, target_lang, model_id, base_id, trees)
    card = ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n"
                     + fill_template(MODEL_CARD.read_text(encoding="utf-8"), values))
    card.save(output_dir / "README.md")


def translator_texts(source_lang: str, target_lang: str, data: str) -> dict[str, str]:
    """The model card's words for what a translation model is and is for."""
    return {"task": f"{source_lang} → {target_lang}", "output": "translation",
            "intended_use": (f"translating {source_lang} text of the kind it was trained on ({data}) into "
                             f"{target_lang}"),
            "out_of_scope": ("text of another domain, style or language than its training data, which it translates "
                             "far worse; any use where a wrong translation can cause harm without a person checking "
                             "it; it is not a general-purpose translation system")}


def parser_texts(source_lang: str, data: str) -> dict[str, str]:
    """The model card's words for what a constituency parser (§6.3) is and is for."""
    return {"task": f"a constituency parser of {source_lang} (§6.3)", "output": "tree",
            "intended_use": (f"parsing {source_lang} sentences of the kind it was trained on ({data}) into "
                             "constituency trees (§6.3), linearized as tensor2tensor writes them, without words "
                             "(vaswani_hf's `training/treebank.py --bracket` puts them back)"),
            "out_of_scope": ("sentences of another domain, style or language than its treebank, which it parses far "
                             "worse; trees it outputs with another number of words than their sentence (`--bracket` "
                             "writes `(TOP)` for them, which EVALB skips); any use where a wrong tree can cause harm "
                             "without a person checking it; it is not a general-purpose parser")}


def set_beams(generation, num_beams: int) -> None:
    """`num_beams` beams; with one (greedy decoding), a beam search's own settings unset: transformers saves no
    generation config that sets them beside one beam."""
    generation.num_beams = num_beams
    if num_beams == 1:
        generation.early_stopping = generation.length_penalty = None


def set_paper_decoding(generation, num_beams: int, alpha: float, extra_length: int = EXTRA_OUTPUT_LENGTH) -> None:
    """The generation config of the paper's decoding (§6.1): beam search of `num_beams` with GNMT's α (greedy with
    one), outputs up to source length + `extra_length`."""
    generation.early_stopping = True  # "terminate early when possible"
    set_beams(generation, num_beams)
    generation.gnmt_alpha = alpha  # generate() then runs the paper's search (gnmt.py)
    generation.extra_length = extra_length
    generation._from_model_config = False  # else from_pretrained drops the entries transformers does not know


def set_run_decoding(generation, num_beams: int, alpha: float,
                     extra_length: int = EXTRA_OUTPUT_LENGTH) -> float | None:
    """A training run's decoding, set in `generation` and the α it decodes with: the paper's with `alpha` and
    `extra_length` where the config asks for the paper's search (a new model's, a start's that does); else, a
    converted start's, the decoding it was published with, with `num_beams` beams (α None)."""
    if papers_decoding(generation):
        set_paper_decoding(generation, num_beams, alpha, extra_length)
        return alpha
    set_beams(generation, num_beams)
    return None


def start_decoding(start: str, config, search_flags: list[str]):
    """The generation config of a fine-tuning run's start model (none saved: its config's, which the tools read as the
    paper's decoding). The first of `search_flags`, flags of the paper's search that the run sets, is a one-line
    SystemExit where the start decodes as it was published (a converted model)."""
    with one_line_errors(start):
        try:
            generation = GenerationConfig.from_pretrained(start)
        except OSError:
            generation = GenerationConfig.from_model_config(config)
    if search_flags and not papers_decoding(generation):
        raise SystemExit(f"error: --{search_flags[0]}: {start} decodes as it was published (its "
                         "generation_config.json), not with the paper's search that the flag sets: leave the flag out")
    return generation


def save_tokenizer(tokenizer, folder: Path) -> None:
    # tokenizer.json names its padding token too, so that it alone is a complete tokenizer (tokenizers,
    # transformers.js, a folder without tokenizer_config.json); padding=True or not, calls pad as they ask.
    if hasattr(tokenizer, "backend_tokenizer"):  # not a SentencePiece one (a converted OPUS-MT model's)
        tokenizer.backend_tokenizer.enable_padding(pad_id=tokenizer.pad_token_id, pad_token=tokenizer.pad_token)
    tokenizer.save_pretrained(folder)


# metrics.json's keys, and the names the card gives them (the last a parser's, --evalb)
METRICS = (("bleu", "sacreBLEU"), ("chrf", "chrF"), ("bleu_tokenized", "BLEU, tokenized (Table 2's)"),
           ("bracket_f1", "bracketing F1 (EVALB)"))
SYNTHETIC_WARNING = """
> **Warning: a test model.** It was trained on the embedded synthetic grammar of vaswani_hf, a small artificial
> language, not on real text: its scores are on that grammar's own test set, and it does not translate real
> sentences. Train on real parallel data for a translation model.
"""


def card_metadata(data: TrainingData, scores: dict[str, dict], source_lang: str, target_lang: str,
                  model_id: str, base_model: str | None = None, trees: bool = False) -> ModelCardData:
    """The card's YAML header, made by huggingface_hub: the results (model-index) only where the data has a Hub id
    (the metadata's dataset fields take one), and only the splits that were scored; the Hub id of the model a
    fine-tuning run started from. A parser's (`trees`) has one language, its sentences', and is tagged and its results
    named as parsing (its pipeline is still the translation pipeline: text in, text out). A split's perplexity (the
    validation set's, run.py's) is a result too."""
    task = f"Constituency parsing {source_lang}" if trees else f"Translation {source_lang}-{target_lang}"
    results = [
        EvalResult(task_type="translation", task_name=task,
                   dataset_type=data.dataset_id, dataset_name=data.dataset_id, dataset_split=split,
                   metric_type=metric, metric_name=name, metric_value=round(split_scores[metric], 2),
                   metric_args={"signature": split_scores[f"{metric}_signature"]})
        for split, split_scores in scores.items() for metric, name in METRICS if metric in split_scores
    ] + [
        EvalResult(task_type="translation", task_name=task, dataset_type=data.dataset_id,
                   dataset_name=data.dataset_id, dataset_split=split, metric_type="perplexity",
                   metric_name="perplexity per target token", metric_value=round(split_scores["perplexity"], 2))
        for split, split_scores in scores.items() if "perplexity" in split_scores
    ] if data.dataset_id else None
    return ModelCardData(
        language=[source_lang] if trees else [source_lang, target_lang], license=data.license,
        library_name="transformers", pipeline_tag="translation",
        tags=["constituency-parsing" if trees else "translation", "transformer", "vaswani_hf",
              "attention-is-all-you-need"],
        datasets=[data.dataset_id] if data.dataset_id else None, model_name=model_id,
        metrics=["bleu", "chrf", "bracket_f1"] if trees else ["bleu", "chrf"],
        eval_results=results, base_model=base_model)


def architecture_text(config) -> str:
    """The model's sizes for the card; the heads' widths where they are not d_model / h (Table 3 row B)."""
    heads = f"{config.num_heads} heads"
    if (config.d_k, config.d_v) != (config.d_model / config.num_heads,) * 2:
        heads += f" (d_k {config.d_k}, d_v {config.d_v})"
    return (f"d_model {config.d_model}, d_ff {config.d_ff}, {heads}, {config.num_layers} encoder and "
            f"{config.num_decoder_layers} decoder layers, a joint vocabulary of {config.vocab_size:,}")


def decoding_text(generation, num_beams: int, alpha: float | None, short: bool = False) -> str:
    """How the saved model decodes, for the card: the paper's search (GNMT's α), or, with `alpha=None`, transformers'
    beam search as the generation config asks, greedy with one beam (a converted model's, fine-tuned)."""
    if alpha is not None:
        return (f"beam {num_beams} and the GNMT length penalty (α = {alpha})" if short else
                f"the paper's way (§6.1): beam search with a beam of {num_beams} and the GNMT length penalty "
                f"((5 + |Y|) / 6)^α, α = {alpha}, up to source length + {extra_length_of(generation)} tokens")
    beams = generation.num_beams or 1
    if beams == 1:
        return ("transformers' greedy search" if short else "as the model it was fine-tuned from was published, with "
                "one beam: transformers' greedy search (not the paper's beam search)")
    penalty = f"log P / |Y|^{1.0 if generation.length_penalty is None else generation.length_penalty:g}"
    return (f"transformers' beam search of {beams} beams ({penalty})" if short else
            f"as the model it was fine-tuned from was published: transformers' beam search with {beams} beams, "
            f"hypotheses ranked by {penalty} (not the paper's GNMT penalty)")


def evaluation_text(scores: dict[str, dict], decoding: str, trees: bool = False) -> str:
    """The card's Evaluation section: a row per split and metric that was scored, decoded as `decoding` says (a
    parser's, `trees`, scored by EVALB too)."""
    if not scores:
        return "No validation or test set was given to this run: it was not evaluated."
    rows = []
    for split, split_scores in scores.items():
        rows += [f"| {split} | {name} | {split_scores[metric]:.2f} | `{cell(split_scores[f'{metric}_signature'])}` |"
                 for metric, name in METRICS if metric in split_scores]
        if "perplexity" in split_scores:
            rows.append(f"| {split} | perplexity | {split_scores['perplexity']:.2f} | per target token, EOS counted |")
    evalb = " and as linearized trees with EVALB (COLLINS.prm)" * trees
    tokenized = any("bleu_tokenized" in found for found in scores.values())
    table2 = ("; BLEU as the paper's Table 2 scored it too, of Moses' tokens with compounds split (tensor2tensor's "
              "get_ende_bleu.sh)") * tokenized
    measured = any("perplexity" in found for found in scores.values())
    perplexity = ("; the perplexity, as Table 3's, is the model's own per token of the references, each read whole "
                  "(`vaswani-translate --score` gives it for any file)") * measured
    scored = f"scored on detokenized text with sacreBLEU{evalb}{table2}{perplexity}"
    return "\n".join([f"Decoded with {decoding}, {scored}:", "",
                      "| split | metric | value | signature |", "|---|---|---|---|", *rows])


def cell(text: str) -> str:
    """`text` in a markdown table's cell: a signature's pipes escaped, which would split the cell (GitHub's and the
    Hub's tables split at every unescaped pipe, inside code spans too)."""
    return text.replace("|", "\\|")


def fill_template(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    if "{{" in text:
        raise ValueError(f"model card placeholder left unfilled: {text[text.index('{{'):].split('}}')[0]}}}}}")
    return text
