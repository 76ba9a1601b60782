"""save_pretrained / from_pretrained: exact round trips, safetensors, tied weights, Hub-ready folders, and
loading as remote code where vaswani_hf is not installed."""

import ast
import json
import sys

import torch
from safetensors.torch import load_file, save_file
from support import CODE_FILES, random_ids, run_hidden, tiny_model
from transformers import AutoModel, AutoModelForSeq2SeqLM

from vaswani_hf import VaswaniForConditionalGeneration, VaswaniModel


def batch():
    source = random_ids(2, 6)
    return {"input_ids": source, "attention_mask": torch.ones_like(source), "decoder_input_ids": source[:, :4]}


def assert_same_model(loaded, original):
    assert loaded.state_dict().keys() == original.state_dict().keys()
    for name, tensor in original.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    with torch.no_grad():
        assert torch.equal(loaded(**batch()).logits, original(**batch()).logits)


def test_save_then_load_is_exact_and_tied_weights_stay_tied(tmp_path):
    model = tiny_model(seed=2)
    model.save_pretrained(tmp_path)
    loaded, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert isinstance(loaded, VaswaniForConditionalGeneration)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert loaded.lm_head.weight is loaded.model.encoder.embed_tokens.weight
    assert loaded.model.decoder.embed_tokens.weight is loaded.model.encoder.embed_tokens.weight
    assert_same_model(loaded.eval(), model)


def test_untied_and_learned_position_variants_round_trip(tmp_path):
    model = tiny_model(seed=3, tie_word_embeddings=False, position_embedding="learned", max_position_embeddings=16)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert loaded.lm_head.weight is not loaded.model.encoder.embed_tokens.weight
    assert_same_model(loaded, model)


def test_a_checkpoint_without_marians_output_bias_loads_it_as_zeros(tmp_path):
    """A model of `add_final_logits_bias` loaded from weights that lack the bias (Marian's, 0 until trained): the
    missing bias is initialized to 0, not left as memory happened to hold it."""
    model = tiny_model(seed=3, add_final_logits_bias=True)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["final_logits_bias"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert torch.equal(loaded.final_logits_bias, torch.zeros(1, 53))
    assert_same_model(loaded, model)


def test_the_saved_folder_is_hub_ready(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert CODE_FILES | {"model.safetensors", "config.json", "generation_config.json"} <= names
    assert not any(name.endswith(".bin") for name in names)
    config = json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))
    assert config["auto_map"] == {
        "AutoConfig": "configuration_vaswani.VaswaniConfig",
        "AutoModelForSeq2SeqLM": "modeling_vaswani.VaswaniForConditionalGeneration",
    }
    generation = json.loads((tmp_path / "generation_config.json").read_text(encoding="utf-8"))
    assert "num_beams" not in generation and "gnmt_alpha" not in generation  # transformers' defaults: greedy
    weights = load_file(tmp_path / "model.safetensors")
    assert not any("position" in key for key in weights)  # §3.5 sinusoids are computed, never stored
    embedding_copies = [key for key in weights if key.endswith("embed_tokens.weight") or key.startswith("lm_head")]
    assert len(embedding_copies) == 1  # one shared matrix on disk


def test_the_code_files_import_only_torch_transformers_and_each_other(translation_folder):
    """Every Python file a run's output folder carries (the model's code, its search, the pipeline) runs
    where only torch and transformers are installed: each import, at any depth, is one of theirs, the standard
    library's, or a file beside it."""
    files = sorted(translation_folder.rglob("*.py"))
    assert {str(p.relative_to(translation_folder)) for p in files} >= CODE_FILES | {
        "pipeline_vaswani.py", "gnmt.py"}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:  # relative: a file in the same folder
                assert (path.parent / f"{(node.module or '').split('.')[0]}.py").is_file(), (path, node.module)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for module in [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]:
                    top = module.split(".")[0]
                    assert top in sys.stdlib_module_names or top in {"torch", "transformers"}, (path, module)


def test_the_base_model_loads_through_auto_model(tmp_path):
    model = VaswaniModel(tiny_model().config).eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, VaswaniModel)
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch()).last_hidden_state, model(**batch()).last_hidden_state)


REMOTE_CODE_SCRIPT = """
    import sys
    import torch
    from transformers import AutoModelForSeq2SeqLM

    folder = sys.argv[1]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    assert not type(model).__module__.startswith("vaswani_hf"), type(model).__module__
    assert not any(name.startswith("vaswani_hf") for name in sys.modules)
    inputs = torch.load(folder + "/inputs.pt")
    with torch.no_grad():
        logits = model(**inputs).logits
    torch.testing.assert_close(logits, torch.load(folder + "/logits.pt"), atol=0, rtol=0)
    tokens = model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=4)
    assert torch.equal(tokens, torch.load(folder + "/tokens.pt"))
    print("remote code OK:", type(model).__module__)
"""


def test_remote_code_loads_in_a_fresh_process_without_the_package(tmp_path):
    model_dir = tmp_path / "model"
    model = tiny_model(seed=4)
    model.save_pretrained(model_dir)
    inputs = batch()
    with torch.no_grad():
        torch.save(model(**inputs).logits, model_dir / "logits.pt")
    torch.save(model.generate(inputs["input_ids"], attention_mask=inputs["attention_mask"], max_new_tokens=4),
               model_dir / "tokens.pt")
    torch.save(inputs, model_dir / "inputs.pt")
    out = run_hidden(REMOTE_CODE_SCRIPT, model_dir, env_extra={"HF_MODULES_CACHE": str(tmp_path / "modules")},
                     cwd=tmp_path)
    assert "remote code OK: transformers_modules" in out
