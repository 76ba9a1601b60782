"""The model among transformers users' tools: the translation pipeline, the Hub both ways, the model card, the
command-line translator and the attention pictures. The model is the session's `translation_folder`: a run's
output folder for a tiny model with a real joint BPE."""

import errno
import io
import json
import math
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import termios
import textwrap
import threading
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from markdown_it import MarkdownIt
from support import CODE_FILES, LENGTH_LIMIT, refusal, refused_translation, run_hidden
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

from training.arguments import DataArguments
from training.default_data import generate as generate_default_data
from training.evaluation import translate
from training.hub import decoding_text, fill_template, start_decoding, write_output_folder
from training.recipe import training_data
from vaswani_hf import TranslationPipeline, quantize_int8
from vaswani_hf.tools.loading import load, papers_decoding
from vaswani_hf.tools.visualize import attention_weights, plot_heads, write_pictures

SOURCES = ["The small dog sees the old man.", "A woman reads a book in the garden.", "The children play."]
TOKEN = "hf_vaswaniTestToken0123456789abcdef"


def load_local(folder):
    return AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


# --- the translation pipeline -------------------------------------------------------------------------------

def test_the_pipeline_translates_model_objects_with_their_generate(translation_folder):
    model, tokenizer = load_local(translation_folder)  # the package's class: transformers' beam search
    translator = TranslationPipeline(model=model, tokenizer=tokenizer)
    assert translator(SOURCES[0]) == [{"translation_text": model_translation(model, tokenizer, SOURCES[0])}]
    batched = translator(SOURCES, batch_size=2)
    assert batched == [translator(s)[0] for s in SOURCES]  # batching changes nothing
    assert all(isinstance(r["translation_text"], str) for r in batched)


def model_translation(model, tokenizer, source, **kwargs) -> str:
    inputs = tokenizer([source], return_tensors="pt")
    return tokenizer.decode(model.generate(**inputs, **kwargs)[0], skip_special_tokens=True)


def test_the_pipeline_passes_generation_arguments(translation_folder):
    """A pipeline call's arguments reach `generate()` as given, as keywords or in a dict (`generate_kwargs`, as
    transformers' pipelines take them: it reached the paper's search as an argument of its own), and the translation
    is `generate()`'s with them."""
    model, tokenizer = load_local(translation_folder)
    translator = TranslationPipeline(model=model, tokenizer=tokenizer)
    calls, generate = [], model.generate

    def recorded_generate(*args, **kwargs):
        calls.append(kwargs)
        return generate(*args, **kwargs)

    model.generate = recorded_generate  # the pipeline calls self.model.generate
    for arguments in ({"num_beams": 1}, {"num_beams": 3, "gnmt_alpha": 1.4}, {"num_beams": 2, "gnmt_alpha": 0.0}):
        calls.clear()
        translated = translator(SOURCES[1], **arguments)[0]["translation_text"]
        assert {name: calls[0].get(name) for name in arguments} == arguments
        assert translated == model_translation(model, tokenizer, SOURCES[1], **arguments)
        assert translator(SOURCES[1], generate_kwargs=arguments)[0]["translation_text"] == translated
        assert {name: calls[-1].get(name) for name in arguments} == arguments and "generate_kwargs" not in calls[-1]
    three = translator(SOURCES[1], num_beams=3, num_return_sequences=3)
    assert len(three) == 3
    # a list of sources: a list of each one's three, and no flattening
    assert translator(SOURCES[1:], num_beams=3, num_return_sequences=3) == [
        three, translator(SOURCES[2], num_beams=3, num_return_sequences=3)]
    assert translator(SOURCES[1:], num_beams=3, num_return_sequences=3, batch_size=2) == [  # one generate() call
        three, translator(SOURCES[2], num_beams=3, num_return_sequences=3)]
    with_tokens = translator(SOURCES[1], num_beams=1, skip_special_tokens=False)[0]["translation_text"]
    assert with_tokens.endswith(tokenizer.eos_token)
    short = translator(SOURCES[1], num_beams=1, max_new_tokens=2)[0]["translation_text"]
    assert len(tokenizer(short, add_special_tokens=False)["input_ids"]) <= 2


def test_the_pipeline_returns_token_ids_as_transformers_4s_did(translation_folder):
    """`return_tensors=True`: each sequence's ids as `generate()` returns them, in place of the text; with
    `return_text=True` both; a blank source's: none."""
    model, tokenizer = load_local(translation_folder)
    translator = TranslationPipeline(model=model, tokenizer=tokenizer)
    expected = model.generate(**tokenizer(SOURCES[:1], return_tensors="pt"), num_beams=3, num_return_sequences=2)
    found = translator(SOURCES[0], num_beams=3, num_return_sequences=2, return_tensors=True)
    assert [list(record) for record in found] == [["translation_token_ids"]] * 2
    assert torch.equal(torch.stack([record["translation_token_ids"] for record in found]), expected)
    (both,) = translator(SOURCES[0], return_tensors=True, return_text=True)
    assert both["translation_text"] == translator(SOURCES[0])[0]["translation_text"]
    assert both["translation_text"] == tokenizer.decode(both["translation_token_ids"], skip_special_tokens=True)
    assert translator(SOURCES[0], return_tensors=False) == translator(SOURCES[0])
    (blank,) = translator(" ", return_tensors=True, return_text=True)
    assert blank["translation_token_ids"].numel() == 0 and blank["translation_text"] == ""


def test_the_pipeline_refuses_a_choice_of_languages_in_one_line_before_decoding(translation_folder):
    """transformers 4's `src_lang` and `tgt_lang` chose a multilingual model's languages: this model translates one
    pair, and either, at construction or in a call, is a ValueError saying so (not the search's refusal of a
    setting), before `generate()` runs."""
    model, tokenizer = load_local(translation_folder)
    model.generate = lambda *args, **kwargs: pytest.fail("generate() ran")
    said = "^src_lang and tgt_lang choose the languages of a multilingual model; this model translates the one pair"
    for languages in ({"src_lang": "en"}, {"tgt_lang": "de"}, {"src_lang": "en", "tgt_lang": "de"}):
        with pytest.raises(ValueError, match=said):
            TranslationPipeline(model=model, tokenizer=tokenizer, **languages)
        with pytest.raises(ValueError, match=said):
            TranslationPipeline(model=model, tokenizer=tokenizer)(SOURCES[0], **languages)


def test_the_pipeline_truncates_long_inputs_instead_of_crashing(translation_folder):
    """A source over `max_input_length` tokens reaches the encoder as its first tokens and </s>, `max_input_length`
    in all, and its translation is that of the truncated source; what is not text is a TypeError; no text, no
    translation: a blank string's is "", alone or batched."""
    model, tokenizer = load_local(translation_folder)
    translator = TranslationPipeline(model=model, tokenizer=tokenizer, num_beams=1, max_new_tokens=3)
    long_text = " ".join(SOURCES * 40)
    full = tokenizer(long_text)["input_ids"]
    truncated = full[:63] + [tokenizer.eos_token_id]
    assert len(full) > 64 and tokenizer(long_text, truncation=True, max_length=64)["input_ids"] == truncated
    encoded = []
    hook = model.get_encoder().register_forward_pre_hook(
        lambda module, args, kwargs: encoded.append(kwargs["input_ids"].tolist()), with_kwargs=True)
    result = translator(long_text, max_input_length=64)
    hook.remove()
    assert encoded == [[truncated]]
    expected = model.generate(torch.tensor([truncated]), num_beams=1, max_new_tokens=3)
    assert result[0]["translation_text"] == tokenizer.decode(expected[0], skip_special_tokens=True)
    # one token over the limit is truncated too; without max_input_length the limit is the model's positions
    encoded.clear()
    hook = model.get_encoder().register_forward_pre_hook(
        lambda module, args, kwargs: encoded.append(len(kwargs["input_ids"][0])), with_kwargs=True)
    translator(long_text, max_input_length=len(full) - 1)
    model.config.max_position_embeddings = 64
    translator(long_text)
    hook.remove()
    assert encoded == [len(full) - 1, 64]
    # transformers 4's `truncation`: True cuts as the default does, without its warning; False does not cut
    from transformers.testing_utils import CaptureLogger
    from transformers.tokenization_utils_base import TruncationStrategy

    from vaswani_hf import pipeline_vaswani

    encoded.clear()
    hook = model.get_encoder().register_forward_pre_hook(
        lambda module, args, kwargs: encoded.append(len(kwargs["input_ids"][0])), with_kwargs=True)
    warned = []
    for truncation in (None, True, "longest_first", TruncationStrategy.ONLY_FIRST, False, "do_not_truncate"):
        with CaptureLogger(pipeline_vaswani.logger) as captured:
            translator(long_text, max_input_length=64, truncation=truncation)
        warned.append("was truncated to 64" in captured.out)
    hook.remove()
    assert encoded == [64, 64, 64, 64, len(full), len(full)]
    assert warned == [True, False, False, False, False, False]
    with pytest.raises(ValueError, match="^truncation must be True, False or one of"):
        translator(long_text, truncation="only_second")
    for limit in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=f"^max_input_length must be a whole number of at least 1, got {limit}$"):
            translator(long_text, max_input_length=limit)
    with pytest.raises(TypeError, match="takes a string, a list of strings or a stream of them .*, got int$"):
        translator(42)
    with pytest.raises(TypeError, match="got a list holding NoneType$"):
        translator([SOURCES[0], None])
    assert translator([]) == []
    nothing = {"translation_text": ""}
    assert translator(["", " \t", SOURCES[2]], batch_size=2) == [nothing, nothing, translator(SOURCES[2])[0]]
    assert translator(" ", num_beams=2, num_return_sequences=2) == [nothing, nothing]


def test_the_pipeline_streams_iterators_and_datasets_as_transformers_pipelines_do(translation_folder):
    """An iterator or a torch Dataset (`KeyDataset`) is read as it is translated, each source's result as translating
    it alone gives; a dataset's column is a list; what a stream holds is checked as it is read."""
    import datasets
    from transformers.pipelines.pt_utils import KeyDataset

    model, tokenizer = load_local(translation_folder)
    translator = TranslationPipeline(model=model, tokenizer=tokenizer, num_beams=1)
    sources = [*SOURCES, "", SOURCES[0]]
    alone = [translator(source) for source in sources]
    read = []

    def stream():
        for source in sources:
            read.append(source)
            yield source

    results = iter(translator(stream(), batch_size=2))  # transformers returns an iterable
    first = next(results)
    assert len(read) < len(sources)  # the rest not read yet
    assert [first, *results] == alone
    assert list(translator(map(str.strip, sources))) == alone
    table = datasets.Dataset.from_dict({"en": sources})
    assert list(translator(KeyDataset(table, "en"), batch_size=3)) == alone
    assert translator(table["en"]) == [result for result, in alone] == translator(tuple(sources))
    assert list(translator(iter([]))) == []
    with pytest.raises(TypeError, match="a torch Dataset such as KeyDataset\\), got a stream holding NoneType$"):
        list(translator(iter([SOURCES[0], None])))
    with pytest.raises(TypeError, match="got Dataset$"):  # its rows are dicts: KeyDataset picks a column
        translator(table)


# --- PEFT's adapters ----------------------------------------------------------------------------------------

def test_peft_lora_adapts_the_projections_by_its_formula_and_the_papers_search_decodes_through_it(translation_folder,
                                                                                                 tmp_path):
    """PEFT's LoRA (Hu et al., 2021) on the attention's query and value projections: a step moves the adapters and
    nothing else; the adapted model computes as the base model with W + (lora_alpha / r) B A written into each of
    those projections by hand, and decodes as it through PEFT's `generate()` (the folder's decoding: the paper's
    search); the adapter saved alone reloads onto the base model, and `merge_and_unload()` gives back this model's
    class, which saves a folder that loads."""
    from peft import LoraConfig, PeftModel, TaskType, get_peft_model

    model, tokenizer = load_local(translation_folder)
    weights = {name: weight.clone() for name, weight in model.state_dict().items()}
    config = LoraConfig(task_type=TaskType.SEQ_2_SEQ_LM, r=4, lora_alpha=8, lora_dropout=0.0,
                        target_modules=["q_proj", "v_proj"])
    adapted = get_peft_model(model, config).train()
    before = {name: weight.clone() for name, weight in adapted.base_model.model.state_dict().items()}
    batch = tokenizer(SOURCES, text_target=SOURCES[::-1], padding=True, return_tensors="pt")
    adapted(**batch).loss.backward()
    torch.optim.Adam(weight for weight in adapted.parameters() if weight.requires_grad).step()
    after = adapted.base_model.model.state_dict()
    assert all(torch.equal(weight, weights[name.replace(".base_layer", "")]) for name, weight in after.items()
               if ".lora_" not in name)
    assert any(not torch.equal(after[name], before[name]) for name in after if ".lora_B." in name)  # B starts at 0

    reference, _ = load_local(translation_folder)
    with torch.no_grad():
        for path, projection in reference.named_modules():
            if path.endswith(("q_proj", "v_proj")):
                lora = adapted.base_model.model.get_submodule(path)
                lora.lora_B["default"].weight.normal_(0.0, 0.5)  # an adapter that changes the translations
                projection.weight += (config.lora_alpha / config.r * lora.lora_B["default"].weight
                                      @ lora.lora_A["default"].weight)
        adapted.eval()
        expected = reference(**batch).logits
        torch.testing.assert_close(adapted(**batch).logits, expected, atol=1e-5, rtol=0)
        inputs = {key: batch[key] for key in ("input_ids", "attention_mask")}
        assert papers_decoding(adapted.generation_config)
        tokens = adapted.generate(**inputs)
        assert torch.equal(tokens, reference.generate(**inputs))
        assert not torch.equal(tokens, load_local(translation_folder)[0].generate(**inputs))

        adapted.save_pretrained(tmp_path / "adapter")
        reloaded = PeftModel.from_pretrained(load_local(translation_folder)[0], tmp_path / "adapter").eval()
        torch.testing.assert_close(reloaded(**batch).logits, expected, atol=1e-5, rtol=0)
        merged = reloaded.merge_and_unload()
        assert type(merged) is type(reference)
        merged.save_pretrained(tmp_path / "merged")
        merged = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "merged").eval()
        torch.testing.assert_close(merged(**batch).logits, expected, atol=1e-5, rtol=0)


# --- the Hub, both ways -------------------------------------------------------------------------------------

def test_the_folder_declares_its_pipeline_and_code(translation_folder):
    config = json.loads((translation_folder / "config.json").read_text(encoding="utf-8"))
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_vaswani.TranslationPipeline"
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_vaswani.VaswaniForConditionalGeneration"
    for name in CODE_FILES | {"pipeline_vaswani.py"}:
        assert (translation_folder / name).is_file(), name


def test_tokenizer_json_alone_pads_as_the_folders_tokenizer_does(translation_folder):
    """tokenizer.json by itself (the tokenizers library, transformers.js) encodes a batch as AutoTokenizer does with
    padding=True: the same ids, padded with the same pad token."""
    from tokenizers import Tokenizer

    _, tokenizer = load_local(translation_folder)
    expected = tokenizer(SOURCES, padding=True)["input_ids"]
    assert len({len(ids) for ids in expected}) == 1 and any(tokenizer.pad_token_id in ids for ids in expected)
    alone = Tokenizer.from_file(str(translation_folder / "tokenizer.json"))
    assert [encoding.ids for encoding in alone.encode_batch(SOURCES)] == expected


def test_one_decoding_however_the_folder_is_loaded(translation_folder, tmp_path, cli):
    """The beam size and GNMT α a run saved (run.py chooses α on the validation set) are what generation_config.json
    asks for, and every way of loading the folder decodes with them: the installed class's generate(), the pipeline,
    vaswani-translate, and the folder's own code under trust_remote_code without the package (the model's and the
    pipeline's classes from the folder, batched two sources at a time)."""
    model, tokenizer = load_local(translation_folder)
    chosen = tmp_path / "chosen"
    data = training_data(DataArguments(), {"train": generate_default_data()["train"][:10]})
    write_output_folder(model, tokenizer, chosen, {}, data=data, length_limit=LENGTH_LIMIT, source_lang="en",
                        target_lang="de", model_id="m", recipe={}, deviations=[], label_smoothing=0.1, batching="b",
                        num_beams=3, alpha=1.4)
    model, tokenizer = load_local(chosen)
    assert (model.generation_config.num_beams, model.generation_config.gnmt_alpha) == (3, 1.4)
    assert model.generation_config.early_stopping is True  # §6.1's "terminate early" for transformers' beams too
    sources = [source for source, _ in generate_default_data()["test"][:12]]
    inputs = tokenizer(sources, return_tensors="pt", padding=True)
    direct = tokenizer.batch_decode(model.generate(**inputs), skip_special_tokens=True)
    assert direct == translate(model, tokenizer, sources, num_beams=3, alpha=1.4)  # the paper's search
    transformers_beam = model.generate(**inputs, length_penalty=1.4)  # transformers' penalty |Y|^α: not the same
    assert direct != tokenizer.batch_decode(transformers_beam, skip_special_tokens=True)
    assert [r["translation_text"] for r in TranslationPipeline(model=model, tokenizer=tokenizer)(sources)] == direct
    result = cli("--model", chosen, "--no_fast_cpu", stdin="\n".join(sources) + "\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == direct
    out = run_hidden(
        """
        import json, sys
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
        model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True)
        tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=True)  # no prompt
        inputs = tokenizer(json.loads(sys.argv[2]), return_tensors="pt", padding=True)
        direct = tokenizer.batch_decode(model.generate(**inputs), skip_special_tokens=True)
        translator = pipeline("translation", model=sys.argv[1], trust_remote_code=True)
        for loaded in (model, translator):
            assert type(loaded).__module__.startswith("transformers_modules"), type(loaded).__module__
        piped = [r["translation_text"] for r in translator(json.loads(sys.argv[2]), batch_size=2)]
        assert not any(name.startswith("vaswani_hf") for name in sys.modules)
        print(json.dumps([direct, piped]))
        """,
        chosen, json.dumps(sources), env_extra={"HF_MODULES_CACHE": str(tmp_path / "modules")},
    )
    assert json.loads(out.splitlines()[-1]) == [direct, direct]


def uploaded_files(folder: Path, allow_patterns) -> set[str]:
    from huggingface_hub.utils import filter_repo_objects

    paths = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    return set(filter_repo_objects(paths, allow_patterns=allow_patterns))


PUBLISHED = CODE_FILES | {"model.safetensors", "config.json", "generation_config.json", "pipeline_vaswani.py",
                          "tokenizer.json", "tokenizer_config.json", "README.md"}


@pytest.mark.parametrize("sharded", [False, True])
def test_vaswani_push_publishes_the_model_and_nothing_of_its_training(translation_folder, tmp_path, monkeypatch,
                                                                      caplog, capsys, sharded):
    """`vaswani-push FOLDER REPO --private` on a finished run's folder, with huggingface_hub's two calls recorded:
    exactly the model's files go up (no checkpoint, metrics, schedule or log), into a private repository made or
    updated, and those files alone load and translate as the folder does, its weights in one file or in shards with
    their index; the token is never printed or written."""
    import huggingface_hub
    from huggingface_hub import RepoUrl

    from vaswani_hf.tools import hub

    folder = tmp_path / "run"
    shutil.copytree(translation_folder, folder)
    expected = PUBLISHED
    if sharded:
        (folder / "model.safetensors").unlink()
        load_local(translation_folder)[0].save_pretrained(folder, max_shard_size="100KB")
        shards = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
        expected = PUBLISHED - {"model.safetensors"} | shards | {"model.safetensors.index.json"}
    for training_file in ("checkpoint-4/model.safetensors", "checkpoint-4/optimizer.safetensors", "schedule.json",
                          "runs/events.out.tfevents.1", "metrics.json", "optimizer.safetensors"):
        (folder / training_file).parent.mkdir(parents=True, exist_ok=True)
        (folder / training_file).write_bytes(b"training")
    calls = []
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo",
                        lambda self, repo_id, **kw: calls.append(("create", repo_id, kw)) or RepoUrl(
                            f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder",
                        lambda self, **kw: calls.append(("upload", uploaded_files(Path(kw["folder_path"]),
                                                                                    kw["allow_patterns"]), kw)))
    hub.main([str(folder), "org/tiny-en-de", "--private"])
    assert calls[0][:2] == ("create", "org/tiny-en-de") and calls[0][2]["private"] is True
    assert calls[0][2]["exist_ok"] is True  # pushing again updates the repository
    files = calls[1][1]
    assert files == expected, files ^ expected
    assert "pushed" in capsys.readouterr().out
    published = tmp_path / "published"
    published.mkdir()
    for name in files:
        shutil.copy(folder / name, published / name)
    model, tokenizer = load_local(folder)
    assert translate(*load_local(published), SOURCES) == translate(model, tokenizer, SOURCES)
    logs = caplog.text + "".join(capsys.readouterr())
    assert TOKEN not in logs
    assert not any(TOKEN.encode() in p.read_bytes() for p in folder.rglob("*") if p.is_file())


def test_vaswani_push_refuses_what_is_not_a_finished_model_in_one_line(translation_folder, tmp_path, monkeypatch):
    import huggingface_hub
    from safetensors.torch import load_file, save_file

    from vaswani_hf.tools import hub

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda *a, **kw: pytest.fail("nothing is created"))
    unfinished = tmp_path / "unfinished"
    shutil.copytree(translation_folder, unfinished,
                    ignore=shutil.ignore_patterns("model.safetensors", "README.md", "tokenizer.json"))
    marian = tmp_path / "marian"
    shutil.copytree(translation_folder, marian)
    config = json.loads((marian / "config.json").read_text(encoding="utf-8"))
    (marian / "config.json").write_text(json.dumps({**config, "model_type": "marian"}), encoding="utf-8")
    damaged = {}
    for name in ("generation_config.json", "model.safetensors"):  # cut short, as by a full disk
        damaged[name] = tmp_path / f"damaged_{name}" / name
        shutil.copytree(translation_folder, damaged[name].parent)
        damaged[name].write_bytes((translation_folder / name).read_bytes()[:100])
    shutil.copytree(translation_folder, misfit := tmp_path / "misfit")
    weights = load_file(misfit / "model.safetensors")
    del weights["model.encoder.layers.0.fc1.bias"]
    save_file(weights, misfit / "model.safetensors", metadata={"format": "pt"})
    refusals = {unfinished: f"{unfinished}: not a finished model folder, no model.safetensors, tokenizer.json, "
                            "README.md",
                marian: f"{marian}: not a vaswani_hf model folder (no config.json of model_type \"vaswani\")",
                tmp_path / "missing": f"{tmp_path / 'missing'}: not a vaswani_hf model folder",
                tmp_path: f"{tmp_path}: not a vaswani_hf model folder",
                "": "the folder is blank: give the model's folder",  # not the current folder
                damaged["generation_config.json"].parent: f"{damaged['generation_config.json']} is damaged: "
                                                          "Unterminated string",
                damaged["model.safetensors"].parent: f"{damaged['model.safetensors']} is damaged: Error while "
                                                     "deserializing header",
                misfit: f"the weights of {misfit} do not fit its config: model.encoder.layers.0.fc1.bias is missing"}
    for folder, message in refusals.items():
        with pytest.raises(SystemExit) as refused:
            hub.main([str(folder), "org/name"])
        assert str(refused.value).startswith(f"error: {message}") and "\n" not in str(refused.value), refused.value


def test_a_hub_that_refuses_or_cannot_be_reached_is_one_line_that_says_how_to_push_again(translation_folder,
                                                                                            monkeypatch, capfd):
    import huggingface_hub
    from huggingface_hub.errors import OfflineModeIsEnabled

    from vaswani_hf.tools import hub

    def offline(*args, **kwargs):
        raise OfflineModeIsEnabled("Cannot reach https://huggingface.co/api/repos/create: offline mode is enabled.\n"
                                   "To disable it, unset HF_HUB_OFFLINE.")

    with monkeypatch.context() as patch:
        patch.setattr(huggingface_hub.HfApi, "create_repo", offline)
        assert refusal(capfd, hub.main, translation_folder, "org/name") == (
            f"error: pushing {translation_folder} to org/name failed: Cannot reach "
            f"https://huggingface.co/api/repos/create: offline mode is enabled. (to try again: vaswani-push "
            f"{translation_folder} org/name)")
    # No network: the Hub's address refuses the connection (nothing listens on port 9 here), which the HTTP client
    # raises as its own error, not an OSError.
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    said = refusal(capfd, hub.main, translation_folder, "org/name")
    assert said.startswith(f"error: pushing {translation_folder} to org/name failed: ") and said.endswith(
        f"(to try again: vaswani-push {translation_folder} org/name)") and "\n" not in said, said


def test_model_push_to_hub_sends_weights_code_config_and_generation_config(tmp_path, monkeypatch):
    import huggingface_hub
    from support import tiny_model

    sent = {}

    def fake_create_commit(self, repo_id, operations, **kwargs):
        sent.update({op.path_in_repo: op.path_or_fileobj for op in operations})
        sent["config.json"] = Path(sent["config.json"]).read_text(encoding="utf-8") if "config.json" in sent else None
        return huggingface_hub.CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/0", commit_message="",
                                          commit_description="", oid="0" * 40)

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **kw: huggingface_hub.RepoUrl(
        f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(huggingface_hub.HfApi, "create_commit", fake_create_commit)
    tiny_model().push_to_hub("org/tiny")
    assert CODE_FILES | {"model.safetensors", "config.json", "generation_config.json",
                         "pipeline_vaswani.py"} <= set(sent)
    config = json.loads(sent["config.json"])
    assert "custom_pipelines" in config and "auto_map" in config
    assert TOKEN not in sent["config.json"]


def test_a_hub_download_loads_offline_by_repo_id_without_the_package(translation_folder, tmp_path):
    """The layout huggingface_hub leaves after a download: models--org--name/{refs/main, snapshots/<sha>/...}."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--org--tiny-en-de"
    shutil.copytree(translation_folder, repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha, encoding="utf-8")
    model, tokenizer = load_local(translation_folder)
    expected = translate(model, tokenizer, SOURCES[:2])
    out = run_hidden(
        """
        import json, sys
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
        tokenizer = AutoTokenizer.from_pretrained("org/tiny-en-de", trust_remote_code=True)  # no prompt
        model = AutoModelForSeq2SeqLM.from_pretrained("org/tiny-en-de", trust_remote_code=True)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        inputs = tokenizer(json.loads(sys.argv[1]), return_tensors="pt", padding=True)
        direct = tokenizer.batch_decode(model.generate(**inputs), skip_special_tokens=True)
        translator = pipeline("translation", model="org/tiny-en-de", trust_remote_code=True)
        print(json.dumps([direct, [r["translation_text"] for r in translator(json.loads(sys.argv[1]))]]))
        """,
        json.dumps(SOURCES[:2]),
        env_extra={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_MODULES_CACHE": str(tmp_path / "modules")},
        cwd=tmp_path,
    )
    direct, piped = json.loads(out.splitlines()[-1])
    assert direct == expected and piped == expected


# --- the model card -------------------------------------------------------------------------------------------

def test_the_model_card_parses_and_carries_the_runs_numbers(translation_folder):
    """The card of a run on the embedded data, parsed by huggingface_hub: its metadata, a warning that the data is
    synthetic, an example from the run's own test sources, the test scores with their signatures, the run's recipe."""
    card = ModelCard.load(translation_folder / "README.md")
    metrics = json.loads((translation_folder / "metrics.json").read_text(encoding="utf-8"))["test"]
    data = card.data.to_dict()
    assert data["language"] == ["en", "de"] and data["license"] == "apache-2.0"  # the project's own data
    assert data["pipeline_tag"] == "translation" and "datasets" not in data and card.data.eval_results is None
    text = " ".join(card.text.split())
    assert "{{" not in card.content and "nan" not in card.content.lower()
    assert "Warning: a test model." in text and "synthetic grammar" in text
    example = generate_default_data()["test"][0][0]
    assert f'tokenizer([{json.dumps(example)}], return_tensors="pt")' in card.text
    for split, metric, name in (("test", "bleu", "sacreBLEU"), ("test", "chrf", "chrF")):
        assert [split, name, f"{metrics[metric]:.2f}", f"`{metrics[metric + '_signature']}`"] in table_rows(card.text)
    for section in ("As published: post-LN sub-layers", "Deviations from the paper", "How to use",
                    "Intended uses and limits", "Out of scope",
                    "Intended use: translating en text of the kind it was trained on (the embedded synthetic",
                    "Input length: " + LENGTH_LIMIT, "Training", "Evaluation", "Citation", 'pipeline("translation"',
                    "AutoModelForSeq2SeqLM", "400 train pairs, 6 test pairs", "recipe: 60 steps"):
        assert section in text, section
    # the run's own recipe, not the paper's: batches of sentences, no dropout or label smoothing, no averaging
    dropout = json.loads((translation_folder / "config.json").read_text(encoding="utf-8"))["dropout"]
    assert (f"batches of 50 sentences, Adam(0.9, 0.98, 1e-9) with the warmup / inverse-square-root schedule, "
            f"dropout P_drop = {dropout:g} and label smoothing ε_ls = 0; the final weights, not averaged."
            ) in text


def table_rows(markdown: str) -> list[list[str]]:
    """The rows of `markdown`'s tables, each cell's text, as a renderer of GitHub's tables (markdown-it, which
    transformers installs through rich) splits them."""
    rows, row = [], None
    for token in MarkdownIt("commonmark").enable("table").parse(markdown):
        if token.type == "tr_open":
            row = []
        elif token.type == "inline" and row is not None:
            row.append(token.content)
        elif token.type == "tr_close":
            rows.append(row)
            row = None
    return rows


SCORES = {split: {"bleu": bleu, "chrf": chrf, "bleu_signature": "nrefs:1|tok:13a", "chrf_signature": "nrefs:1|nc:6"}
          for split, bleu, chrf in (("validation", 31.234, 55.5), ("test", 29.876, 54.321))}
SCORES["validation"] |= {"loss": 2.156, "perplexity": 8.637}  # run.py measures the validation set's
SCORES["test"] |= {"bleu_tokenized": 30.456, "bleu_tokenized_signature": "moses:de|compounds:split|tok:none"}


@pytest.mark.parametrize("source", ["files", "files with an id and a license", "a Hub dataset",
                                    "a local dataset folder", "German to English"])
def test_the_model_card_names_the_data_as_given_and_claims_no_license(translation_folder, tmp_path, source):
    """Cards of runs on the user's data, parsed by huggingface_hub's ModelCard and its metadata classes: the data as
    the user named it (a Hub dataset id in the metadata, or the file or folder names in the text: no path of this
    machine, nor a local folder as a Hub id), a license only where the user declared one, the results in the metadata
    only with a dataset id and only for the splits that were scored, no NaN, and the example in the source language.
    (huggingface_hub's `ModelCard.validate` asks the Hub itself, which tests do not reach.)"""
    model, tokenizer = load_local(translation_folder)
    pairs = {split: generate_default_data()[split][:3] for split in ("train", "validation", "test")}
    for split, rows in pairs.items():  # aligned text files, as a user gives them
        for side, lang in enumerate(("en", "de")):
            (tmp_path / f"{split}.{lang}").write_text("".join(row[side] + "\n" for row in rows), encoding="utf-8")
    files = {f"{split}_file": str(tmp_path / split) for split in pairs}
    scores = dict(SCORES)
    source_lang, target_lang = "en", "de"
    if source == "files":
        flags = DataArguments(**files)
    elif source == "files with an id and a license":
        flags = DataArguments(**files, card_dataset="org/captions", card_license="cc-by-4.0")
    elif source == "a Hub dataset":
        flags = DataArguments(dataset_name="org/news", dataset_config_name="de-en")
        del pairs["test"], scores["test"]  # no test split: nothing scored, nothing written for it
    elif source == "a local dataset folder":  # as datasets.load_dataset reads it (here it need not hold the pairs)
        (tmp_path / "corpus").mkdir()
        flags = DataArguments(dataset_name=str(tmp_path / "corpus"), dataset_config_name="de-en")
    else:
        flags = DataArguments(**files, source_lang="de", target_lang="en")
        pairs = {split: [(de, en) for en, de in rows] for split, rows in pairs.items()}
        source_lang, target_lang = "de", "en"
    out = tmp_path / "out"
    write_output_folder(model, tokenizer, out, {"train_steps": 1, **scores}, data=training_data(flags, pairs),
                        length_limit=LENGTH_LIMIT, source_lang=source_lang, target_lang=target_lang, model_id="m",
                        recipe={}, deviations=[], label_smoothing=0.1, batching="b")
    card = ModelCard.load(out / "README.md")
    metadata = card.data.to_dict()
    text = " ".join(card.text.split())
    assert "nan" not in card.content.lower() and "{{" not in card.content and "Warning" not in text
    assert metadata["language"] == [source_lang, target_lang]
    assert metadata.get("license") == {"files with an id and a license": "cc-by-4.0"}.get(source)
    dataset_id = {"files with an id and a license": "org/captions", "a Hub dataset": "org/news"}.get(source)
    assert metadata.get("datasets") == ([dataset_id] if dataset_id else None)
    results = card.data.eval_results or []
    expected = {(dataset_id, split, metric, round(values[metric], 2), values.get(f"{metric}_signature"))
                for split, values in scores.items() for metric in ("bleu", "chrf", "bleu_tokenized", "perplexity")
                if metric in values}
    assert {(r.dataset_type, r.dataset_split, r.metric_type, r.metric_value, (r.metric_args or {}).get("signature"))
            for r in results} == (expected if dataset_id else set())
    for split, values in scores.items():  # the text always has the scores
        assert [split, "sacreBLEU", f"{values['bleu']:.2f}", f"`{values['bleu_signature']}`"] in table_rows(card.text)
    assert ["validation", "perplexity", "8.64", "per target token, EOS counted"] in table_rows(card.text)
    assert "the perplexity, as Table 3's, is the model's own per token of the references" in text
    table2 = ["test", "BLEU, tokenized (Table 2's)", "30.46", "`moses:de|compounds:split|tok:none`"]
    assert (table2 in table_rows(card.text)) == ("test" in scores)
    assert ("BLEU as the paper's Table 2 scored it too, of Moses' tokens with compounds split" in text) == (
        "test" in scores)
    if source == "a Hub dataset":
        assert "Data: the Hub dataset org/news (de-en); 3 train pairs, 3 validation pairs." in text
        assert "| test |" not in text
    elif source == "a local dataset folder":
        assert "Data: the local dataset folder corpus (de-en); 3 train pairs, 3 validation pairs, 3 test" in text
        assert str(tmp_path) not in card.content
    else:
        assert f"local files (train: train.{source_lang} + train.{target_lang}; validation: " in text
    assert f"tokenizer([{json.dumps(pairs['test' if 'test' in pairs else 'validation'][0][0])}]" in card.text
    assert "local files" not in card.content.split("---")[1]  # not in the metadata


def test_a_parsers_card_on_a_hub_dataset_names_its_results_parsing_with_evalbs_f1(translation_folder, tmp_path):
    """A parser's (§6.3, --evalb) metadata: its results are constituency parsing of the sentences' language, with
    EVALB's F1 beside BLEU and chrF, each with its signature; the card's table has the F1."""
    model, tokenizer = load_local(translation_folder)
    sentences = ("bleu_tokenized", "bleu_tokenized_signature")  # Table 2's BLEU: translations', not trees'
    scores = {"test": {**{key: value for key, value in SCORES["test"].items() if key not in sentences},
                       "bracket_f1": 91.234, "bracket_f1_signature": "EVALB COLLINS.prm"}}
    pairs = {"train": [("the dog sleeps .", "S NP DT NN /NP VP VBZ /VP . /S")]}
    write_output_folder(model, tokenizer, tmp_path, {"train_steps": 1, **scores},
                        data=training_data(DataArguments(dataset_name="org/wsj", target_lang="tree"), pairs),
                        length_limit=LENGTH_LIMIT, source_lang="en", target_lang="tree", model_id="m", recipe={},
                        deviations=[], label_smoothing=0.1, batching="b", trees=True)
    card = ModelCard.load(tmp_path / "README.md")
    assert {(r.task_name, r.dataset_type, r.metric_type, r.metric_value, r.metric_args["signature"])
            for r in card.data.eval_results} == {
        ("Constituency parsing en", "org/wsj", metric, round(scores["test"][metric], 2),
         scores["test"][f"{metric}_signature"]) for metric in ("bleu", "chrf", "bracket_f1")}
    assert "| test | bracketing F1 (EVALB) | 91.23 | `EVALB COLLINS.prm` |" in card.text
    assert "scored on detokenized text with sacreBLEU and as linearized trees with EVALB (COLLINS.prm):" in card.text
    assert (card.data.language, card.data.metrics) == (["en"], ["bleu", "chrf", "bracket_f1"])


def test_the_model_card_lists_every_deviation_and_the_averaged_checkpoints(translation_folder, tmp_path):
    """The config's own deviations (`VaswaniConfig.deviations`) come first, then the run's, one line each; the recipe
    names how many checkpoints were averaged, and one is no average."""
    model, tokenizer = load_local(translation_folder)
    model.config.attention_dropout = 0.2
    data = training_data(DataArguments(), {"train": generate_default_data()["train"][:10]})
    write_output_folder(model, tokenizer, tmp_path, {"averaged_checkpoints": ["checkpoint-20", "checkpoint-30"]},
                        data=data, length_limit=LENGTH_LIMIT, source_lang="en", target_lang="de", model_id="m",
                        recipe={}, deviations=["the run's own deviation"], label_smoothing=0.1, batching="b")
    text = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert ("its training:\n\n- dropout on the attention weights (`attention_dropout=0.2`)\n"
            "- the run's own deviation\n\n") in text
    assert "As published, except for the deviations below: post-LN sub-layers" in " ".join(text.split())
    assert "label smoothing ε_ls = 0.1; the last 2 checkpoints averaged." in " ".join(text.split())
    write_output_folder(model, tokenizer, tmp_path / "one", {"averaged_checkpoints": ["checkpoint-30"]},
                        data=data, length_limit=LENGTH_LIMIT, source_lang="en", target_lang="de", model_id="m",
                        recipe={}, deviations=[], label_smoothing=0.1, batching="b")
    one = " ".join((tmp_path / "one" / "README.md").read_text(encoding="utf-8").split())
    assert "label smoothing ε_ls = 0.1; the final weights, not averaged." in one


BUDGET = ("a 5-minute budget (training/budget.py): warmup over 4% of the steps the machine was measured to make in "
          "it, the §5.3 decay after it{}, the peak of the §5.3 curve for `warmup_steps`")
FITTED = ("P_drop fitted to the epochs the run was expected to make (training/budget.py): none up to 1, rising "
          "linearly to the recipe's `dropout` at 3 (the run's last value below)")


@pytest.mark.parametrize("flags, data, lines", [
    ({"tokens_per_step": 12000}, {}, ["`tokens_per_step=12000` (paper: 25000)"]),
    ({"warmup_steps": 8000}, {}, ["`warmup_steps=8000` (paper: 4000)"]),
    ({"lr_scale": 2.0}, {}, ["`lr_scale=2.0` (paper: 1.0)"]),
    ({"label_smoothing": 0.0}, {}, ["`label_smoothing=0.0` (paper: 0.1)"]),
    ({"num_beams": 1}, {}, ["`num_beams=1` (paper: 4; its parser, §6.3: 21)"]),
    ({"length_penalty_alpha": 1.0}, {}, ["`length_penalty_alpha=1.0` (paper: 0.6; its parser, §6.3: 0.3)"]),
    ({"extra_length": 300}, {}, ["`extra_length=300` (paper: 50; its parser, §6.3: 300)"]),
    ({"max_grad_norm": 1.0}, {}, ["gradients clipped to a global L2 norm of 1 (paper: no clipping)"]),
    ({"alpha_candidates": [0.6, 1.0]}, {}, ["GNMT α chosen on the validation set among [0.6, 1.0]"]),
    ({"average_checkpoints": 2}, {}, ["`average_checkpoints=2` (paper: 5 for base, 20 for big)"]),
    ({"average_checkpoints": 20}, {}, []),
    ({"save_steps": 500}, {}, ["checkpoints every 500 steps (paper: every 10 minutes)"]),
    ({"save_minutes": 0}, {}, ["no checkpoints before the last step (paper: every 10 minutes)"]),
    ({"max_train_minutes": 5}, {},
     [BUDGET.format(""), "the averaged checkpoints spread over the last 10% of the budget"]),
    ({"max_train_minutes": 5, "cooldown_share": 0.2, "save_minutes": 1}, {},
     [BUDGET.format(", then to zero over the last 20%"), "checkpoints every minute (paper: every 10 minutes)"]),
    ({"save_minutes": 2.5, "save_steps": 1}, {},
     ["checkpoints every 2.5 minutes and every step (paper: every 10 minutes)"]),
    ({"dropout_epochs": [1.0, 3.0]}, {}, [FITTED]),
    ({}, {"streaming": True, "shuffle_buffer": 2000, "bpe_sample": 500},
     ["the joint BPE learned from the first 500 training pairs",
      "the training pairs streamed, grouped by length 2,000 at a time (training/streaming.py)"]),
])
def test_a_run_with_run_pys_defaults_is_the_papers_recipe_and_each_change_is_one_line_of_the_card(flags, data, lines):
    """§5.3-§5.4 and §6.1's values: the defaults deviate from none of them; each flag changed is named once."""
    from training.arguments import RecipeArguments
    from training.recipe import recipe_deviations

    assert recipe_deviations(RecipeArguments(), DataArguments()) == []
    assert recipe_deviations(RecipeArguments(**flags), DataArguments(**data)) == [f"recipe: {line}" for line in lines]


def test_the_cards_data_is_named_by_the_flags_that_name_it(tmp_path, monkeypatch):
    """--card_dataset names a Hub dataset's id for the card's metadata; --card_license the embedded data's license;
    a streamed split is not counted; --dataset_name . is the folder it means."""
    pairs = {"train": (pair for pair in generate_default_data()["train"][:3]), "validation": [("a", "b")]}
    hub = training_data(DataArguments(dataset_name="org/news", card_dataset="org/news-clean"), pairs)
    assert hub.dataset_id == "org/news-clean" and hub.sizes == {"train": "streamed", "validation": 1}
    assert training_data(DataArguments(card_license="cc0-1.0"), {"train": [("a", "b")]}).license == "cc0-1.0"
    (tmp_path / "corpus").mkdir()
    monkeypatch.chdir(tmp_path / "corpus")
    here = training_data(DataArguments(dataset_name="."), {"train": [("a", "b")]})
    assert (here.description, here.dataset_id) == ("the local dataset folder corpus", None)


def test_the_card_states_the_alpha_and_batch_the_run_chose_not_the_flags_that_asked_for_them(translation_folder,
                                                                                            tmp_path):
    """run.py's output folder after a run that chose GNMT α 1.2 among its candidates (flag: 0.6), batches of 4,096
    tokens (--max_tokens 0) and bf16 (--mixed_precision auto): the card's recipe and deviations state what the model
    was made with."""
    from training.arguments import ModelArguments, RecipeArguments
    from training.run import publish

    model, tokenizer = load_local(translation_folder)
    args = RecipeArguments(output_dir=str(tmp_path), max_tokens=0, length_penalty_alpha=0.6,
                           alpha_candidates=[0.6, 1.2])
    pairs = {"train": generate_default_data()["train"][:10]}
    publish(model, tokenizer, tmp_path, {"max_tokens": 4096, "distributed": {"mixed_precision": "bf16"}}, pairs, 1.2,
            DataArguments(), ModelArguments(), args, print)
    text = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert '"length_penalty_alpha": 1.2,' in text and '"max_tokens": 4096,' in text
    assert '"mixed_precision": "bf16"' in text and '"auto"' not in text
    assert "- recipe: `length_penalty_alpha=1.2` (paper: 0.6; its parser, §6.3: 0.3)\n" in text
    assert json.loads((tmp_path / "generation_config.json").read_text(encoding="utf-8"))["gnmt_alpha"] == 1.2


def test_a_model_card_placeholder_left_unfilled_is_an_error():
    """A placeholder the code does not fill is an error when the card is written, not text on the Hub."""
    assert fill_template("{{a}} and {{a}}", {"a": "x"}) == "x and x"
    with pytest.raises(ValueError, match=r"^model card placeholder left unfilled: \{\{b\}\}$"):
        fill_template("{{a}} and {{b}}.", {"a": "x"})


# --- the command-line translator ------------------------------------------------------------------------------

def test_vaswani_translate_is_a_console_script():
    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts["vaswani-translate"] == "vaswani_hf.tools.translate:main"


def test_vaswani_translate_reads_stdin_and_files(translation_folder, tmp_path, cli):
    model, tokenizer = load_local(translation_folder)
    lines = [SOURCES[0], "", SOURCES[1]]
    result = cli("--model", translation_folder, "--max_tokens", "20", "--num_beams", "4", "--device", "cpu",
                 stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [translate(model, tokenizer, [SOURCES[0]])[0], "",
                                          translate(model, tokenizer, [SOURCES[1]])[0]]
    (tmp_path / "in.txt").write_text("\n".join(SOURCES), encoding="utf-8")
    result = cli("--model", translation_folder, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt",
                 "--num_beams", "1")
    assert result.returncode == 0, result.stderr
    written = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    assert written == translate(model, tokenizer, SOURCES, num_beams=1)
    # --extra_length: outputs up to the source's length + 1 token (the model's own limit: 50).
    result = cli("--model", translation_folder, "--extra_length", "1", stdin="\n".join(SOURCES) + "\n")
    assert result.returncode == 0, result.stderr
    model.generation_config.extra_length = 1
    assert result.stdout.splitlines() == translate(model, tokenizer, SOURCES) != translate(*load_local(
        translation_folder), SOURCES)


def test_vaswani_translate_threads_over_no_more_cores_than_it_may_use(translation_folder, monkeypatch, cli):
    """In a container whose CPU limit (a cgroup quota: `docker run --cpus 1`) is below the cores its affinity shows,
    torch's default threads over them all, slower than on fewer (benchmarks/README.md, session 150): vaswani-translate
    takes at most `usable_cores` (joblib's count, the limit in it), unless OMP_NUM_THREADS decides.
    `torch.set_num_threads` recorded, not called."""
    from vaswani_hf.tools import translate

    threads = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # torch's default: the affinity's 2 cores
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    monkeypatch.setattr(translate, "usable_cores", lambda: 1)  # the container's limit: 1
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for _ in range(2):
        result = cli("--model", translation_folder, "--num_beams", "1", "--device", "cpu", "--no_fast_cpu",
                     stdin=SOURCES[0] + "\n")
        assert result.returncode == 0, result.stderr
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's choice, kept
    assert threads == [1]


def test_under_a_locale_of_another_encoding_the_tools_write_utf8(tmp_path, translation_folder, cli):
    """A locale whose encoding is not UTF-8 (ASCII here: LC_ALL=C with Python's coercion off; latin-1 and a Windows
    code page, where output is redirected to a file, lack α as well) changes nothing the tools write: run.py's
    standard output (its α) and model card (its § and ε, read from model_card.md), and vaswani-translate's
    translations, are UTF-8 and what they are in a UTF-8 locale. Before, run.py stopped at its α, its training done
    and its model folder not written, and vaswani-translate at a translation's ß; the card read its template as the
    locale's text."""
    splits = generate_default_data()
    for split, size in (("train", 300), ("validation", 4), ("test", 4)):
        rows = (json.dumps({"en": en, "de": de}, ensure_ascii=False) + "\n" for en, de in splits[split][:size])
        (tmp_path / f"{split}.jsonl").write_text("".join(rows), encoding="utf-8")
    sources = tmp_path / "sources.en"
    sources.write_text("".join(en + "\n" for en, _ in splits["test"][:12]), encoding="utf-8")
    translated = cli("--model", translation_folder, "--input", sources, "--quiet", "--no_fast_cpu")
    assert translated.returncode == 0 and not translated.stdout.isascii(), translated  # a ß, an umlaut to write
    run = ["--output_dir", tmp_path / "run", "--d_model", "16", "--d_ff", "32", "--num_heads", "2", "--num_layers",
           "1", "--vocab_size", "300", "--max_tokens", "400", "--tokens_per_step", "400", "--max_steps", "2",
           "--eval_steps", "0", "--no_fast_cpu", "--alpha_candidates", "0.6", "1.0",
           *(f"--{split}_file={tmp_path / split}.jsonl" for split in ("train", "validation", "test"))]
    script = textwrap.dedent(f"""
        import codecs, locale, runpy, sys
        encodings = locale.getpreferredencoding(False), sys.stdout.encoding
        assert [codecs.lookup(encoding).name for encoding in encodings] == ["ascii", "ascii"]
        sys.argv = ["training/run.py", *{[str(arg) for arg in run]!r}]
        runpy.run_path("training/run.py", run_name="__main__")
        print("=" * 10, flush=True)
        sys.stdout.reconfigure(encoding="ascii")  # as a new process in this locale starts
        from vaswani_hf.tools.translate import main
        main(["--model", {str(translation_folder)!r}, "--input", {str(sources)!r}, "--quiet", "--no_fast_cpu"])
    """)
    env = {**os.environ, "LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0", "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONIOENCODING", None)
    result = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent.parent, env=env,
                            capture_output=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    trained, translations = result.stdout.decode("utf-8").split("=" * 10 + "\n")
    assert "GNMT α by validation" in trained
    assert translations == translated.stdout
    card = (tmp_path / "run" / "README.md").read_bytes().decode("utf-8")
    assert "Recipe (§5)" in card and "label smoothing ε_ls = " in card  # the template's words


def test_vaswani_translate_int8_decodes_with_the_int8_copy(translation_folder, capfd, monkeypatch, cli):
    model, tokenizer = load_local(translation_folder)
    result = cli("--model", translation_folder, "--int8", stdin="\n".join(SOURCES) + "\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == translate(quantize_int8(model), tokenizer, SOURCES)
    assert refused_translation(capfd, monkeypatch, "--model", translation_folder, "--int8", "--device", "cuda",
                               stdin=b"Hello.\n") == "error: int8 runs on the CPU, not on cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # on a GPU machine, --int8 alone is the CPU's
    int8, _ = load(str(translation_folder), int8=True, fast=False)
    assert translate(int8, tokenizer, SOURCES) == result.stdout.splitlines()


MANY = [*SOURCES, "", "The old man and the small dog see the children in the garden.", "A dog.", "", "", SOURCES[1]]


def test_batches_by_tokens_change_no_translation(translation_folder, cli):
    """Batches cut by token count, sorted by length inside windows of lines: whatever the cut, the same output."""
    from vaswani_hf.tools.translate import read_windows, translated_windows

    model, tokenizer = load_local(translation_folder)
    expected = [translate(model, tokenizer, [source])[0] if source else "" for source in MANY]
    text = "\n".join(MANY) + "\n"
    for max_tokens, window in ((1, 2000), (30, 3), (4096, 1)):  # what the command line runs, in this process
        windows = read_windows(io.BytesIO(text.encode()), "the input", window)
        written = translated_windows(model, tokenizer, windows, max_tokens, num_beams=None, alpha=None, nbest=1)
        assert "".join(piece for piece, *_ in written).split("\n") == [*expected, ""], (max_tokens, window)
    result = cli("--model", translation_folder, "--quiet", stdin=text)  # and the command line, with its defaults
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n") == [*expected, ""]


def test_scores_are_written_in_input_order_as_batches_finish(translation_folder):
    """--score's lines come in input order as the batches finish, not a window at a time: with a batch a pair, the
    window's lines in several pieces, each piece the lines whose pairs and predecessors are scored, with their tokens
    and log P; together, `score`'s lines (blank lines among them)."""
    from vaswani_hf.tools.translate import score, scored_windows

    model, tokenizer = load_local(translation_folder)
    pairs = list(zip(MANY, reversed(MANY)))
    found = score(model, tokenizer, *zip(*pairs))
    pieces = list(scored_windows(model, tokenizer, [(1, pairs)], max_tokens=1, alpha=None, normalize=False))
    assert "".join(piece.text for piece in pieces) == "".join(f"{pair.log_prob:.4f}\n" for pair in found)
    assert sum(piece.lines > 0 for piece in pieces) > 1 and all(
        piece.text.count("\n") == piece.lines for piece in pieces)
    assert sum(piece.tokens for piece in pieces) == sum(pair.tokens for pair in found)
    assert sum(piece.log_prob for piece in pieces) == pytest.approx(sum(pair.log_prob for pair in found))


def test_a_saved_synthid_watermark_is_refused_by_the_papers_search_in_one_line_before_anything_is_decoded(
        translation_folder, tmp_path, cli):
    """A generation config's SynthID watermark, which the paper's beam search cannot apply (gnmt.py), stops
    vaswani-translate in one line before it decodes; one beam reorders nothing and translates."""
    folder = shutil.copytree(translation_folder, tmp_path / "marked")
    saved = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    (folder / "generation_config.json").write_text(json.dumps({**saved, "watermarking_config": {
        "ngram_len": 2, "keys": [5, 7]}}), encoding="utf-8")
    refused = cli("--model", folder, "--quiet", stdin="A dog.\n")
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr == (f"error: {folder}'s generation config: SynthID's watermarking_config keeps each row's "
                              "past from step to step, which the paper's beam search reorders: leave it out, or "
                              "sample (do_sample=True)\n")
    greedy = cli("--model", folder, "--quiet", "--num_beams", "1", stdin="A dog.\n")
    assert greedy.returncode == 0 and greedy.stdout.count("\n") == 1


def test_token_batches_hold_at_most_max_tokens_sorted_by_length():
    from vaswani_hf.tools.translate import token_batches

    lengths = [7, 3, 12, 3, 5, 40, 8, 1]
    batches = token_batches(lengths, max_tokens=16)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    flat = [lengths[i] for batch in batches for i in batch]
    assert flat == sorted(lengths)
    assert all(len(batch) * max(lengths[i] for i in batch) <= 16 or len(batch) == 1 for batch in batches)
    assert [[lengths[i] for i in batch] for batch in batches] == [[1, 3, 3], [5, 7], [8], [12], [40]]
    assert token_batches([4, 4, 4, 4], max_tokens=16) == [[0, 1, 2, 3]]  # exactly max_tokens


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe, windows of 2", "terminal"])
def test_output_streams_as_batches_finish(translation_folder, monkeypatch, capfd, terminal):
    """With windows of 2 lines, the first two translations arrive while the input is still open; lines typed at a
    terminal, each one as it is entered, without a progress bar. vaswani-translate's main() reads a pipe or a
    pseudo-terminal and writes a pipe, in a thread of this process (a process of its own would add only its
    imports)."""
    from transformers.utils.logging import enable_progress_bar

    from vaswani_hf.tools import translate as command

    monkeypatch.setattr(command, "keep_freed_memory", lambda: None)  # as support's console: not in the test process
    source_write, source_read = pty.openpty() if terminal else os.pipe()[::-1]
    output_read, output_write = os.pipe()
    if terminal:  # a terminal reading lines as typed, without echoing them
        settings = termios.tcgetattr(source_read)
        settings[3] &= ~termios.ECHO
        termios.tcsetattr(source_read, termios.TCSANOW, settings)
    flags = [] if terminal else ["--window", "2"]
    failed = []

    def translating():
        # The output is closed at the end, as at a process's exit: the reader sees where it ends.
        with (open(source_read, encoding="utf-8") as stdin, open(output_write, "w", encoding="utf-8") as stdout,
              monkeypatch.context() as patch):
            patch.setattr(sys, "stdin", stdin)
            patch.setattr(sys, "stdout", stdout)
            try:
                command.main(["--model", str(translation_folder), *flags])
            except BaseException as error:  # noqa: BLE001 — shown by the test, below
                failed.append(error)
            finally:
                enable_progress_bar()

    thread = threading.Thread(target=translating)
    thread.start()
    with open(source_write, "w", encoding="utf-8") as stdin, open(output_read, encoding="utf-8") as stdout:
        first = SOURCES[:1] if terminal else SOURCES[:2]
        stdin.write("".join(f"{line}\n" for line in first))
        stdin.flush()
        assert select.select([stdout], [], [], 120)[0], "no translation while the input is open"
        early = [stdout.readline() for _ in first]
        stdin.write("".join(f"{line}\n" for line in SOURCES[len(first):]))
        if terminal:
            stdin.write("\x04")  # Ctrl-D: the end of a terminal's input
            stdin.flush()
        else:
            stdin.close()  # the end of a pipe's
        rest = stdout.read()
    thread.join()
    assert not failed, failed
    model, tokenizer = load_local(translation_folder)
    assert [line.rstrip("\n") for line in early] + rest.splitlines() == translate(model, tokenizer, SOURCES)
    assert ("lines" in capfd.readouterr().err) != terminal


def test_progress_goes_to_stderr_with_lines_and_tokens_per_second(translation_folder, tmp_path, cli):
    """The file's last line has no newline: it counts in the total all the same."""
    (tmp_path / "in.txt").write_text("\n".join(MANY), encoding="utf-8")
    result = cli("--model", translation_folder, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt")
    assert result.returncode == 0 and result.stdout == ""
    assert f"{len(MANY)}/{len(MANY)}" in result.stderr and "lines" in result.stderr
    assert int(re.findall(r"(\d+) tokens/s", result.stderr)[-1]) > 0
    assert len((tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")) == len(MANY) + 1


def test_nbest_prints_the_searchs_n_best_with_their_gnmt_scores(translation_folder, capfd, monkeypatch, cli):
    """Two sources in one batch, a line of spaces (blank: empty translations scored 0), a window after it; the
    tokens counted (of each best hypothesis, EOS included) are the search's."""
    from vaswani_hf.gnmt import gnmt_beam_search
    from vaswani_hf.tools.translate import translations

    model, tokenizer = load_local(translation_folder)
    lines = [SOURCES[0], SOURCES[1], " \t", SOURCES[2]]
    result = cli("--model", translation_folder, "--nbest", "3", "--quiet", "--window", "3",
                 stdin="\n".join(lines) + "\n")
    assert result.returncode == 0, result.stderr
    rows = [line.split(" ||| ") for line in result.stdout.splitlines()]
    assert [int(index) for index, _, _ in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]  # the input's, across windows
    assert [(text, float(score)) for _, text, score in rows[6:9]] == [("", 0.0)] * 3
    found = {found.index: found for found in translations(model, tokenizer, lines[:2], nbest=3)}  # one batch
    for index in (0, 1, 3):
        inputs = tokenizer(lines[index], return_tensors="pt")
        sequences, scores = gnmt_beam_search(model, inputs["input_ids"], num_beams=4, alpha=0.6,
                                             num_return_sequences=3, output_scores=True)
        ours = rows[3 * index : 3 * index + 3]
        assert [text for _, text, _ in ours] == tokenizer.batch_decode(sequences, skip_special_tokens=True)
        assert [float(score) for _, _, score in ours] == pytest.approx(scores.tolist(), abs=1e-4)
        assert ours[0][1] == translate(model, tokenizer, [lines[index]])[0]
        if index < 2:
            best = sequences[0, 1:]  # after the start token
            assert found[index].tokens == int(best.ne(tokenizer.pad_token_id).sum())
    assert refused_translation(capfd, monkeypatch, "--model", translation_folder, "--nbest", "5",
                               stdin=b"A dog.\n") == "error: --nbest 5 is more than the beam size 4"


SCORED = generate_default_data()["test"][:11] + [("The small dog sees the old man.", "")]  # an empty translation


@pytest.mark.parametrize("divisor", ["none", "--normalize", "--alpha"])
def test_score_writes_each_translations_log_p_and_the_perplexity_per_token(translation_folder, tmp_path, cli,
                                                                          divisor):
    """--score: a line for each pair, log P(translation | source) as the model gives it a sentence at a time
    (support.summed_nll, no padding: EOS counted, an empty translation's too), divided by its tokens (--normalize) or
    by the GNMT penalty ((5 + |Y|) / 6)^α (--alpha), in windows and batches of several lengths; on stderr the
    perplexity per token of them all."""
    from support import summed_nll

    model, tokenizer = load_local(translation_folder)
    (tmp_path / "in.txt").write_text("".join(source + "\n" for source, _ in SCORED), encoding="utf-8")
    (tmp_path / "de.txt").write_text("".join(target + "\n" for _, target in SCORED), encoding="utf-8")
    flags = {"none": [], "--normalize": ["--normalize"], "--alpha": ["--alpha", "1.5"]}[divisor]
    result = cli("--model", translation_folder, "--input", tmp_path / "in.txt", "--score", tmp_path / "de.txt",
                 "--window", "5", "--max_tokens", "40", *flags)
    assert result.returncode == 0, result.stderr
    found = [float(line) for line in result.stdout.splitlines()]
    expected, total, tokens = [], 0.0, 0
    for pair in SCORED:
        nll, length = summed_nll(model, tokenizer, [pair])
        divided = {"none": 1, "--normalize": length, "--alpha": ((5 + length) / 6) ** 1.5}[divisor]
        expected.append(-nll / divided)
        total, tokens = total + nll, tokens + length
    assert found == pytest.approx(expected, abs=1e-4)
    perplexity = float(re.search(r"perplexity (\S+) over the ([\d,]+) tokens", result.stderr)[1])
    assert perplexity == pytest.approx(math.exp(total / tokens), rel=1e-4)
    assert f"over the {tokens:,} tokens (EOS included) of the {len(SCORED)} translations scored" in result.stderr


def test_a_hypothesis_of_the_search_scores_as_the_search_scored_it(translation_folder):
    """The search builds log P a step at a time from the cache; the scorer reads each hypothesis whole: divided by
    the GNMT penalty they agree, for each of the n best of sources in one batch, padded on either side; `score`'s list
    is in the pairs' order."""
    from vaswani_hf.gnmt import gnmt_beam_search, gnmt_length_penalty
    from vaswani_hf.tools.translate import TorchEngine, score

    model, tokenizer = load_local(translation_folder)
    inputs = tokenizer(SOURCES, padding=True, return_tensors="pt")
    sequences, scores = gnmt_beam_search(model, inputs["input_ids"], inputs["attention_mask"], num_beams=4,
                                         alpha=0.6, num_return_sequences=3, output_scores=True)
    ended = [row for row in sequences[:, 1:].tolist() if tokenizer.eos_token_id in row]  # not cut at the limit
    assert len(ended) == len(sequences)
    hypotheses = [row[: row.index(tokenizer.eos_token_id) + 1] for row in ended]
    sources = [ids for ids in inputs["input_ids"].tolist() for _ in range(3)]
    sources = [[i for i in ids if i != tokenizer.pad_token_id] for ids in sources]
    log_probs = TorchEngine(model, tokenizer).score(sources, hypotheses)
    rescored = [log_p / gnmt_length_penalty(len(ids), 0.6) for log_p, ids in zip(log_probs, hypotheses)]
    assert rescored == pytest.approx(scores.tolist(), abs=1e-5)
    tokenizer.padding_side = "left"  # a tokenizer that pads sources on the left: read right-padded, as the search does
    assert TorchEngine(model, tokenizer).score(sources, hypotheses) == pytest.approx(log_probs, abs=1e-5)
    texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in hypotheses[::3]]
    in_order = score(model, tokenizer, SOURCES, texts, max_tokens=1)  # a pair a batch, the longest first
    assert [pair.index for pair in in_order] == [0, 1, 2]


def test_translating_with_a_training_model_decodes_without_dropout_and_leaves_it_training(translation_folder):
    """training/run.py scores BLEU between steps: the search runs in eval mode, and the run goes on training."""
    model = AutoModelForSeq2SeqLM.from_pretrained(translation_folder, dropout=0.5)
    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    expected = translate(model.eval(), tokenizer, SOURCES[:4])
    assert translate(model.train(), tokenizer, SOURCES[:4]) == expected and model.training


def test_a_translation_holding_a_newline_is_still_one_output_line():
    """One output line per input line, whatever a tokenizer decodes (a converted model's vocabulary may hold a
    newline)."""
    from vaswani_hf.tools.translate import output_lines

    assert output_lines("A dog.", [("Ein\nHund.", -1.0)], 0, 1) == "Ein Hund.\n"
    assert output_lines("A dog.", [("Ein\nHund.", -1.0), ("Hund", -2.5)], 7, 2) == \
        "7 ||| Ein Hund. ||| -1.0000\n7 ||| Hund ||| -2.5000\n"


def test_a_converted_models_greedy_translations_are_scored_by_the_log_probability_of_their_tokens(
        translation_folder):
    """A generation config without `gnmt_alpha` (a converted model's) is decoded by `generate()`; with one beam each
    translation's score is the log-probability of its tokens, EOS included, as teacher forcing computes it."""
    from vaswani_hf.tools.translate import translations

    model, tokenizer = load_local(translation_folder)
    del model.generation_config.gnmt_alpha
    model.generation_config.num_beams, model.generation_config.max_new_tokens = 1, 40  # as vaswani-convert sets them
    found = sorted(translations(model, tokenizer, SOURCES, nbest=1))
    for (index, [(text, score)], _), source in zip(found, SOURCES, strict=True):
        inputs = tokenizer(source, return_tensors="pt")
        with torch.no_grad():
            sequence = model.generate(**inputs, num_beams=1)[0]
            log_probs = model(**inputs, decoder_input_ids=sequence[None, :-1]).logits[0].log_softmax(-1)
        assert text == tokenizer.decode(sequence, skip_special_tokens=True)
        assert score == pytest.approx(log_probs.gather(-1, sequence[1:, None]).sum().item(), abs=1e-4)


def test_a_converted_models_beams_are_scored_as_generate_ranks_them(translation_folder):
    """With 4 beams, each hypothesis and its score are transformers' beam search's (`sequences_scores`: log P over
    |Y|^length_penalty), not a sum of its steps' scores."""
    from vaswani_hf.tools.translate import translations

    model, tokenizer = load_local(translation_folder)
    del model.generation_config.gnmt_alpha
    model.generation_config.num_beams = 4
    for index, hypotheses, _ in translations(model, tokenizer, SOURCES[:4], nbest=2):
        found = model.generate(**tokenizer(SOURCES[index], return_tensors="pt"), num_return_sequences=2,
                               output_scores=True, return_dict_in_generate=True)
        assert [text for text, _ in hypotheses] == tokenizer.batch_decode(found.sequences, skip_special_tokens=True)
        assert [score for _, score in hypotheses] == pytest.approx(found.sequences_scores.tolist(), abs=1e-5)


@pytest.mark.parametrize("problem", ["missing", "empty", "broken config", "no weights"])
def test_vaswani_translate_explains_a_bad_model_folder_in_one_line(translation_folder, tmp_path, capfd, monkeypatch,
                                                                  problem):
    """In this process (support.refused_translation): the command's own stderr is tested in test_misuse.py."""
    folder = tmp_path / "model"
    if problem != "missing":
        folder.mkdir()
    if problem == "broken config":
        shutil.copytree(translation_folder, folder, dirs_exist_ok=True)
        (folder / "config.json").write_text("{ not json", encoding="utf-8")
    if problem == "no weights":
        shutil.copytree(translation_folder, folder, dirs_exist_ok=True)
        (folder / "model.safetensors").unlink()
    assert str(folder) in refused_translation(capfd, monkeypatch, "--model", folder, stdin=b"Hello.\n")


# --- attention pictures -----------------------------------------------------------------------------------------

def test_attention_weights_are_distributions_and_the_decoder_is_masked(translation_folder):
    model, tokenizer = load_local(translation_folder)
    weights = attention_weights(model, tokenizer, SOURCES[0], "Der kleine Hund sieht den alten Mann.", layer=1)
    heads, source_length = model.config.num_heads, len(weights.source_tokens)
    target_length = len(weights.target_tokens)
    assert weights.encoder.shape == (heads, source_length, source_length)
    assert weights.decoder.shape == (heads, target_length, target_length)
    assert weights.cross.shape == (heads, target_length, source_length)
    for tensor in (weights.encoder, weights.decoder, weights.cross):
        torch.testing.assert_close(tensor.sum(-1), torch.ones(tensor.shape[:-1]), atol=1e-5, rtol=0)
    above_diagonal = torch.ones(target_length, target_length, dtype=torch.bool).triu(1)
    assert torch.all(weights.decoder[:, above_diagonal] == 0)
    assert weights.target_tokens[0] == tokenizer.bos_token
    deepest = attention_weights(model, tokenizer, SOURCES[0], "Hallo.", layer=-3)  # the decoder's bottom layer alone
    assert (deepest.encoder_layer, deepest.decoder_layer, deepest.encoder) == (None, 0, None)
    assert model.config._attn_implementation == "sdpa"  # the eager switch for the weights is undone
    for layer in (3, -4):  # the tiny model's stacks: 2 encoder layers, 3 decoder layers
        with pytest.raises(ValueError, match=f"^layer {layer} does not exist: the model has 2 encoder and 3 decoder "
                                             "layers"):
            attention_weights(model, tokenizer, SOURCES[0], "Hallo.", layer=layer)


def test_a_bfloat16_models_attention_weights_are_float32_and_drawn(translation_folder, tmp_path):
    """matplotlib draws no bfloat16 tensor."""
    model, tokenizer = load_local(translation_folder)
    weights = attention_weights(model.to(torch.bfloat16), tokenizer, SOURCES[0], "Hallo.")
    assert {tensor.dtype for tensor in (weights.encoder, weights.decoder, weights.cross)} == {torch.float32}
    assert all(path.is_file() for path in write_pictures(weights, tmp_path))


def test_attention_weights_of_a_training_model_are_without_dropout_and_it_goes_on_training(translation_folder):
    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(translation_folder, dropout=0.5, attention_dropout=0.5)
    expected = attention_weights(model.eval(), tokenizer, SOURCES[0], "Hallo.", layer=0)
    found = attention_weights(model.train(), tokenizer, SOURCES[0], "Hallo.", layer=0)
    assert model.training
    assert all(torch.equal(getattr(found, name), getattr(expected, name)) for name in ("encoder", "decoder", "cross"))


@pytest.mark.parametrize("layer", [0, -1])
def test_attention_weights_are_the_layers_softmax_of_scaled_query_key_products(translation_folder, layer):
    """Each picture's heads are softmax(Q K^T / sqrt(d_k)) (§3.2.1) of the chosen layer's own attention, computed here
    from the inputs its three attention modules receive, the decoder's masked above the diagonal; without a target,
    the decoder reads the model's translation."""
    model, tokenizer = load_local(translation_folder)
    config, seen = model.config, {}
    stacks = {"encoder": model.model.encoder.layers[layer].self_attn,
              "decoder": model.model.decoder.layers[layer].self_attn,
              "cross": model.model.decoder.layers[layer].encoder_attn}

    def record(name):  # the last call's inputs: the teacher-forced pass comes after the translation's
        def hook(module, args, kwargs):
            seen[name] = (args[0], kwargs.get("key_value_states"))
        return hook

    hooks = [module.register_forward_pre_hook(record(name), with_kwargs=True) for name, module in stacks.items()]
    try:
        weights = attention_weights(model, tokenizer, SOURCES[1], layer=layer)
    finally:
        for hook in hooks:
            hook.remove()
    translation = translate(model, tokenizer, [SOURCES[1]])[0]
    assert weights.target_tokens == [tokenizer.bos_token, *tokenizer.tokenize(translation)]
    for name, module in stacks.items():
        queries, memory = seen[name]
        keys = queries if memory is None else memory
        q = module.q_proj(queries)[0].unflatten(-1, (config.num_heads, -1)).transpose(0, 1)
        k = module.k_proj(keys)[0].unflatten(-1, (config.num_heads, -1)).transpose(0, 1)
        scores = q @ k.transpose(-1, -2) / config.d_k**0.5
        if name == "decoder":
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(getattr(weights, name), scores.softmax(-1).detach(), atol=1e-6, rtol=0)


def test_a_deeper_stacks_layers_are_drawn_and_a_negative_layer_counts_from_each_top(translation_folder, tmp_path):
    """3 encoder layers, 2 decoder layers: --layer -1 is the encoder's layer 2 and the decoder's layer 1, in pictures
    named so; --layer 2 draws the encoder's alone; a layer neither stack has is one line."""
    from transformers.utils.logging import enable_progress_bar

    from vaswani_hf import VaswaniForConditionalGeneration
    from vaswani_hf.tools.visualize import main

    model, tokenizer = load_local(translation_folder)
    deeper = VaswaniForConditionalGeneration(model.config.__class__(**{
        **model.config.to_diff_dict(), "num_layers": 3, "num_decoder_layers": 2})).eval()
    deeper.save_pretrained(tmp_path / "deeper")
    tokenizer.save_pretrained(tmp_path / "deeper")
    try:
        for layer in ("-1", "2"):
            main([str(tmp_path / "deeper"), "--source", SOURCES[0], "--target", "Hallo.", "--layer", layer,
                  "--output_dir", str(tmp_path / f"pictures{layer}")])
    finally:
        enable_progress_bar()
    assert sorted(path.name for path in (tmp_path / "pictures-1").iterdir()) == [
        "cross_attention_layer1.png", "decoder_self_attention_layer1.png", "encoder_self_attention_layer2.png"]
    assert [path.name for path in (tmp_path / "pictures2").iterdir()] == ["encoder_self_attention_layer2.png"]
    top, encoder_2, decoder_1 = (attention_weights(deeper, tokenizer, SOURCES[0], "Hallo.", layer=layer)
                                 for layer in (-1, 2, 1))
    assert (encoder_2.encoder_layer, encoder_2.decoder_layer) == (2, None)
    assert encoder_2.decoder is None and encoder_2.cross is None
    assert torch.equal(top.encoder, encoder_2.encoder)
    assert torch.equal(top.decoder, decoder_1.decoder) and torch.equal(top.cross, decoder_1.cross)
    with pytest.raises(ValueError, match="^layer -4 does not exist: the model has 3 encoder and 2 decoder layers"):
        attention_weights(deeper, tokenizer, SOURCES[0], "Hallo.", layer=-4)


def test_the_visualize_command_writes_one_picture_per_attention(translation_folder, tmp_path, capfd):
    """Its main() in this process (a process of its own adds only imports; test_readme.py runs the console script);
    transformers' progress bars, which it turns off, are turned back on after. A second sentence's pictures of the
    same layer in the same folder are refused, the first ones kept, unless --overwrite."""
    from transformers.utils.logging import enable_progress_bar, is_progress_bar_enabled

    from vaswani_hf.tools.visualize import main

    folder = tmp_path / "pictures"
    bars = is_progress_bar_enabled()
    try:
        capfd.readouterr()
        main([str(translation_folder), "--source", SOURCES[0], "--layer", "0", "--output_dir", str(folder)])
        names = ("encoder_self_attention", "decoder_self_attention", "cross_attention")
        assert capfd.readouterr().out.splitlines() == [f"{folder}/{name}_layer0.png" for name in names]
        for name in names:
            path = folder / f"{name}_layer0.png"
            assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        pictures = {path: path.read_bytes() for path in folder.iterdir()}
        second = [translation_folder, "--source", SOURCES[1], "--layer", "0", "--output_dir", folder]
        message = refusal(capfd, main, *second)
        assert message == f"error: {folder}/encoder_self_attention_layer0.png exists: give another --output_dir, " \
                          "or --overwrite"
        assert {path: path.read_bytes() for path in folder.iterdir()} == pictures
        main([str(arg) for arg in second] + ["--overwrite"])
        redrawn = {path: path.read_bytes() for path in folder.iterdir()}
        assert redrawn.keys() == pictures.keys() and all(redrawn[path] != pictures[path] for path in pictures)
        for name in names[:2]:  # the last picture alone left: refused as well
            (folder / f"{name}_layer0.png").unlink()
        assert refusal(capfd, main, *second).startswith(f"error: {folder}/cross_attention_layer0.png exists")
    finally:
        if bars:
            enable_progress_bar()


def test_a_picture_the_disk_cannot_hold_is_removed_and_said_in_one_line(translation_folder, tmp_path, capfd,
                                                                       monkeypatch):
    """The disk full while the second picture is written: one line, the first picture whole, no part of the second."""
    from vaswani_hf.tools import visualize

    folder, plot_heads = tmp_path / "pictures", visualize.plot_heads

    def full_at_the_second(weights, queries, keys, title, path):
        if any(folder.iterdir()):
            path.write_bytes(b"\x89PNG")
            raise OSError(errno.ENOSPC, "No space left on device")
        plot_heads(weights, queries, keys, title, path)

    monkeypatch.setattr(visualize, "plot_heads", full_at_the_second)
    message = refusal(capfd, visualize.main, translation_folder, "--source", SOURCES[0], "--output_dir", folder)
    assert message == (f"error: --output_dir {folder}: the pictures could not be written ([Errno 28] No space left on "
                       "device)")
    assert [path.name for path in folder.iterdir()] == ["encoder_self_attention_layer1.png"]


@pytest.mark.parametrize(("flags", "expected"), [
    (["--layer", "7"], ("error: layer 7 does not exist: the model has 2 encoder and 3 decoder layers (from 0; "
                        "negative from the top)")),
    (["--source", " "], "error: --source is blank: give a sentence"),
    (["--target", ""], "error: --target is blank: give a sentence, or none for the model's translation"),
    (["--output_dir", "{file}"], "error: --output_dir {file}: {file} is a file"),
    (["--output_dir", "{file}/pictures"], "error: --output_dir {file}/pictures: {file} is a file"),
    (["--output_dir", ""], "error: --output_dir is blank: give a folder"),
])
def test_the_visualize_command_explains_misuse_in_one_line(translation_folder, tmp_path, capfd, flags, expected):
    """In this process (support.refusal): the message, and nothing else on stdout or stderr, and no picture."""
    from vaswani_hf.tools.visualize import main

    (tmp_path / "file").write_text("someone's notes\n", encoding="utf-8")
    flags = [flag.format(file=tmp_path / "file") for flag in flags]
    message = refusal(capfd, main, translation_folder, "--source", SOURCES[0], "--target", "Hallo.",
                      "--output_dir", tmp_path / "pictures", *flags)
    assert message == expected.format(file=tmp_path / "file")
    assert not (tmp_path / "pictures").exists() and (tmp_path / "file").read_bytes() == b"someone's notes\n"


def test_write_pictures_draws_every_head_with_its_weights_and_tokens(translation_folder, tmp_path, monkeypatch):
    """Each picture's figure, caught as it is closed: one heatmap per head holding that head's weights (queries down,
    keys across), titled by the head, its axes labelled with the tokens; the PNG is the figure's size."""
    import matplotlib.pyplot as plt
    from PIL import Image

    model, tokenizer = load_local(translation_folder)
    weights = attention_weights(model, tokenizer, SOURCES[2], "Die Kinder spielen.", layer=-1)
    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda figure: figures.append(figure))
    paths = write_pictures(weights, tmp_path)  # each stack's top: 2 encoder layers, 3 decoder layers
    assert [p.name for p in paths] == ["encoder_self_attention_layer1.png", "decoder_self_attention_layer2.png",
                                       "cross_attention_layer2.png"]
    source, target = weights.source_tokens, weights.target_tokens
    expected = [(weights.encoder, source, source), (weights.decoder, target, target), (weights.cross, target, source)]
    for figure, path, (tensor, queries, keys) in zip(figures, paths, expected, strict=True):
        drawn = [axis for axis in figure.axes if axis.images]
        assert len(drawn) == len(figure.axes) == model.config.num_heads <= 4  # one row of at most 4, no blank panel
        for head, axis in enumerate(drawn):
            assert axis.get_title() == f"head {head + 1}"
            assert torch.equal(torch.as_tensor(axis.images[0].get_array()), tensor[head])
            assert [label.get_text() for label in axis.get_xticklabels()] == keys
            assert [label.get_text() for label in axis.get_yticklabels()] == queries
        width, height = figure.get_size_inches() * figure.dpi  # saved at the figure's dpi, to a pixel's rounding
        with Image.open(path) as picture:
            assert all(abs(a - b) <= 1 for a, b in zip(picture.size, (width, height)))
        close(figure)


def test_more_heads_than_four_wrap_into_rows_of_four_every_head_drawn(tmp_path, monkeypatch):
    """6 heads (the paper's base has 8): two rows of four panels, heads 1-6 drawn in order, the two left over blank."""
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", lambda figure: figures.append(figure))
    weights = torch.rand(6, 2, 3)
    plot_heads(weights, ["a", "b"], ["x", "y", "z"], "six heads", tmp_path / "six.png")
    (figure,) = figures
    drawn = [axis for axis in figure.axes if axis.images]
    assert len(figure.axes) == 8 and [axis.get_title() for axis in drawn] == [f"head {h}" for h in range(1, 7)]
    assert all(torch.equal(torch.as_tensor(axis.images[0].get_array()), weights[h]) for h, axis in enumerate(drawn))
    assert [axis.axison for axis in figure.axes] == [True] * 6 + [False] * 2
    assert {round(axis.get_position().y0, 2) for axis in figure.axes[:4]} != {
        round(axis.get_position().y0, 2) for axis in figure.axes[4:]}  # two rows
    plt.close(figure)


def test_a_published_decoding_with_one_beam_or_none_set_is_named_greedy():
    """The card's words for a converted model's decoding (α None): one beam, or none set (transformers 5 leaves
    num_beams None, which generate() runs as one), is greedy search, not "beam search of 1 beams"."""
    for beams in (1, None):
        generation = GenerationConfig(num_beams=beams)
        assert decoding_text(generation, 1, None, short=True) == "transformers' greedy search"
        assert decoding_text(generation, 1, None).endswith("with one beam: transformers' greedy search (not the "
                                                           "paper's beam search)")
    assert decoding_text(GenerationConfig(num_beams=3), 3, None, short=True) == ("transformers' beam search of 3 "
                                                                                "beams (log P / |Y|^1)")


def test_a_start_without_a_generation_config_decodes_with_the_papers_search(translation_folder, tmp_path):
    """A start folder without generation_config.json (model.save_pretrained of an older transformers) is one of
    ours, whose config the tools read as the paper's decoding: a fine-tuning run may set the search's flags."""
    shutil.copytree(translation_folder, start := tmp_path / "start")
    (start / "generation_config.json").unlink()
    config = AutoModelForSeq2SeqLM.from_pretrained(start).config
    assert papers_decoding(start_decoding(str(start), config, ["length_penalty_alpha"]))


def test_a_fine_tuned_models_card_names_its_start_a_hub_id_in_the_metadata_a_folder_without_its_path(
        translation_folder, tmp_path):
    """`base_model` (run_trainer.py's --model_name_or_path): a Hub id goes to the metadata's base_model and to the
    deviations; a folder here is named there by its name alone, and is not in the metadata."""
    model, tokenizer = load_local(translation_folder)
    data = training_data(DataArguments(), {"train": generate_default_data()["train"][:10]})
    for start in ("org/opus-mt-en-de-vaswani", str(tmp_path / "models" / "opus")):
        out = tmp_path / "out" / str(len(start))
        write_output_folder(model, tokenizer, out, {}, data=data, length_limit=LENGTH_LIMIT, source_lang="en",
                            target_lang="de", model_id="m", recipe={}, deviations=[], label_smoothing=0.1,
                            batching="b", base_model=start)
        card = ModelCard.load(out / "README.md")
        named = start if start.startswith("org/") else "the local model folder opus"
        assert (f"- recipe: fine-tuned from {named}, its weights and tokenizer, not from the paper's "
                "initialization") in card.text
        assert card.data.to_dict().get("base_model") == (start if start.startswith("org/") else None)
        assert str(tmp_path / "models") not in card.content


def test_the_card_states_the_beam_alpha_and_limit_the_model_decodes_and_was_scored_with(translation_folder,
                                                                                         tmp_path):
    """The run's beam size and chosen α reach generation_config.json, the card's decoding paragraph and its
    Evaluation section alike; the model's output limit (here §6.3's +300), its paragraph and its uses."""
    model, tokenizer = load_local(translation_folder)
    model.generation_config.extra_length = 300
    data = training_data(DataArguments(), {"train": generate_default_data()["train"][:10]})
    scores = {"test": {"bleu": 31.5, "bleu_signature": "nrefs:1", "chrf": 55.0, "chrf_signature": "nrefs:1"}}
    write_output_folder(model, tokenizer, tmp_path, scores, data=data, length_limit=LENGTH_LIMIT, source_lang="en",
                        target_lang="de", model_id="m", recipe={}, deviations=[], label_smoothing=0.1, batching="b",
                        num_beams=5, alpha=1.2)
    generation = json.loads((tmp_path / "generation_config.json").read_text(encoding="utf-8"))
    assert (generation["num_beams"], generation["gnmt_alpha"]) == (5, 1.2)
    card = " ".join((tmp_path / "README.md").read_text(encoding="utf-8").split())
    assert ("decodes as `generation_config.json` asks, the paper's way (§6.1): beam search with a beam of 5 and the "
            "GNMT length penalty ((5 + |Y|) / 6)^α, α = 1.2, up to source length + 300 tokens.") in card
    assert "translation is at most the source's length + 300 tokens." in card
    assert "Decoded with beam 5 and the GNMT length penalty (α = 1.2), scored on detokenized text" in card
