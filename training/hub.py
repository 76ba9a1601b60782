"""The run's output folder as a Hub model repository, and the upload."""

import json
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
MODEL_CARD = ROOT / "model_card.md"
UPLOAD_IGNORE = ["checkpoint-*/**", ".incomplete-checkpoint-*/**", "vaswani/**", "runs/**"]

# The paper's architecture (§3) as VaswaniConfig values; anything else is a deviation and the card says so.
PAPER_ARCHITECTURE = {
    "normalize_before": (False, "pre-LN sub-layers x + Dropout(Sublayer(LayerNorm(x))) instead of post-LN"),
    "tie_word_embeddings": (True, "untied source embedding, target embedding and pre-softmax projection"),
    "position_embedding": ("sinusoidal", "learned position embeddings instead of sinusoids (Table 3 row E)"),
    "scale_embedding": (True, "embeddings not multiplied by sqrt(d_model)"),
    "attention_dropout": (0.0, "dropout on the attention weights"),
    "activation_dropout": (0.0, "dropout after the feed-forward ReLU"),
}


def architecture_deviations(config) -> list[str]:
    return [f"{text} (`{name}={getattr(config, name)!r}`)" for name, (paper, text) in PAPER_ARCHITECTURE.items()
            if getattr(config, name) != paper]


def write_output_folder(model, tokenizer, output_dir: Path, metrics: dict, *, dataset: str, source_lang: str,
                        target_lang: str, model_id: str, recipe: dict, deviations: list[str], label_smoothing: float,
                        batching: str, num_beams: int = 4, alpha: float = 0.6) -> None:
    """Weights (safetensors), config with auto_map and custom_pipelines, code files, tokenizer, the generation config
    of the paper's decoding (beam size and GNMT α), metrics, and README.md — the model card with this run's
    numbers. The card states the run's own recipe: its `batching` (how batches were made), its label smoothing, the
    dropout of its config and the checkpoints `metrics` says were averaged."""
    generation = model.generation_config
    generation.num_beams = num_beams
    generation.early_stopping = True
    generation.gnmt_alpha = alpha  # generate() then runs the paper's search (gnmt.py)
    generation._from_model_config = False  # else from_pretrained drops the entries transformers does not know
    model.save_pretrained(output_dir)
    # tokenizer.json names its padding token too, so that it alone is a complete tokenizer (tokenizers,
    # transformers.js, a folder without tokenizer_config.json); padding=True or not, calls pad as they ask.
    tokenizer.backend_tokenizer.enable_padding(pad_id=tokenizer.pad_token_id, pad_token=tokenizer.pad_token)
    tokenizer.save_pretrained(output_dir)
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
    deviations = architecture_deviations(model.config) + deviations
    averaged = len(metrics.get("averaged_checkpoints", []))
    values = {
        "source_lang": source_lang,
        "target_lang": target_lang,
        "dataset": dataset,
        "model_id": model_id,
        "parameters": f"{model.num_parameters() / 1e6:.1f}M",
        "architecture": (f"d_model {model.config.d_model}, d_ff {model.config.d_ff}, {model.config.num_heads} heads, "
                         f"{model.config.num_layers} encoder and {model.config.num_decoder_layers} decoder layers, "
                         f"a joint vocabulary of {model.config.vocab_size}"),
        "batching": batching,
        "dropout": f"{model.config.dropout:.3g}",
        "label_smoothing": f"{label_smoothing:g}",
        "deviations": "\n".join(f"- {d}" for d in deviations) or "- none",
        "steps": str(metrics.get("train_steps")),
        "minutes": f"{metrics.get('train_minutes', 0):.1f}",
        "averaging": f"the last {averaged} checkpoints averaged" if averaged > 1 else "the final weights, not averaged",
        "recipe": json.dumps(recipe, indent=1),
        "num_beams": str(num_beams),
        "alpha": str(alpha),
    }
    test = metrics.get("test", {})
    for name in ("bleu", "chrf"):
        values[name] = f"{test.get(name, float('nan')):.2f}"
        values[f"{name}_signature"] = test.get(f"{name}_signature", "n/a")
    (output_dir / "README.md").write_text(fill_template(MODEL_CARD.read_text(), values))


def fill_template(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    if "{{" in text:
        raise ValueError(f"model card placeholder left unfilled: {text[text.index('{{'):].split('}}')[0]}}}}}")
    return text


def push(output_dir: Path, repo_id: str, private: bool = False) -> str:
    """Create the model repository if needed and upload the folder (without checkpoints and logs). The token is
    huggingface_hub's own (HF_TOKEN or `hf auth login`); it is never read, printed or written here."""
    from huggingface_hub import HfApi

    api = HfApi()
    repo = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    api.upload_folder(repo_id=repo.repo_id, folder_path=str(output_dir), ignore_patterns=UPLOAD_IGNORE,
                      commit_message="Upload model trained with vaswani_hf")
    return str(repo)
