"""The run's output folder as a Hub model repository, and the upload."""

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import vaswani_hf

ROOT = Path(__file__).resolve().parent.parent
MODEL_CARD = ROOT / "model_card.md"
UPLOAD_IGNORE = ["checkpoint-*/**", ".incomplete-checkpoint-*/**", "vaswani/**"]


def write_output_folder(model, tokenizer, output_dir: Path, metrics: dict, data_args, model_args, args) -> None:
    """Weights (safetensors), config with auto_map, code files, tokenizer, generation config, metrics, the
    paper's decoding as custom_generate/generate.py, and README.md — the model card with this run's numbers."""
    generation = model.generation_config
    generation.num_beams = args.num_beams
    generation.early_stopping = True
    generation.gnmt_alpha = args.length_penalty_alpha  # read by custom_generate/generate.py
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    (output_dir / "custom_generate").mkdir(exist_ok=True)
    shutil.copy(Path(vaswani_hf.__file__).parent / "gnmt.py", output_dir / "custom_generate" / "generate.py")
    (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=1))
    (output_dir / "README.md").write_text(model_card(metrics, data_args, model_args, args, model))


def model_card(metrics: dict, data_args, model_args, args, model) -> str:
    test = metrics.get("test", {})
    dataset = data_args.dataset_name or ("local files" if data_args.train_file else "vaswani_hf embedded EN-DE grammar")
    values = {
        "source_lang": data_args.source_lang,
        "target_lang": data_args.target_lang,
        "dataset": dataset,
        "bleu": f"{test.get('bleu', float('nan')):.2f}",
        "chrf": f"{test.get('chrf', float('nan')):.2f}",
        "bleu_signature": test.get("bleu_signature", "n/a"),
        "chrf_signature": test.get("chrf_signature", "n/a"),
        "parameters": f"{model.num_parameters() / 1e6:.1f}M",
        "steps": str(metrics.get("train_steps")),
        "minutes": f"{metrics.get('train_minutes', 0):.1f}",
        "averaged": str(len(metrics.get("averaged_checkpoints", []))),
        "model_id": args.hub_model_id or Path(args.output_dir).name,
        "recipe": json.dumps({**asdict(model_args), **{k: v for k, v in asdict(args).items()
                                                       if k not in ("push_to_hub", "hub_model_id", "resume_from_checkpoint")}}, indent=1),
    }
    text = MODEL_CARD.read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def push(output_dir: Path, repo_id: str, private: bool = False) -> str:
    """Create the model repository if needed and upload the folder (without checkpoints and logs)."""
    from huggingface_hub import HfApi

    api = HfApi()
    repo = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    api.upload_folder(repo_id=repo.repo_id, folder_path=str(output_dir), ignore_patterns=UPLOAD_IGNORE,
                      commit_message="Upload model trained with vaswani_hf")
    return str(repo)
