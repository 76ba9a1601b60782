"""`vaswani-export`: the CTranslate2 and ONNX exports, run by the real `ctranslate2` and `onnxruntime`, against our
own model on a briefly trained EN-DE model (support's `translation_folder`)."""

import copy
import errno
import itertools
import json
import shutil
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import ctranslate2
import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from ctranslate2.converters import TransformersConverter
from ctranslate2.specs.model_spec import Variable, visit_spec
from support import BOS, refusal, save_marian_folder, tiny_model
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from training.default_data import generate
from training.hub import set_paper_decoding
from vaswani_hf import quantize_int8
from vaswani_hf.exports.onnx_runtime import OnnxSeq2Seq
from vaswani_hf.exports.to_ctranslate2 import VaswaniConverter, seven_bits
from vaswani_hf.exports.to_ctranslate2 import export as export_ctranslate2
from vaswani_hf.gnmt import gnmt_beam_search
from vaswani_hf.speed import fast_cpu as fast_cpu_module
from vaswani_hf.speed.fast_cpu import ROUNDS
from vaswani_hf.tools.export import main as export_main
from vaswani_hf.tools.translate import translate, translations

PAIRS = generate()["test"][:40]
# One worker exports once for all of these (pyproject.toml's -n), minutes of work: scheduled early (conftest.py).
pytestmark = [pytest.mark.xdist_group("export"), pytest.mark.long(minutes=1.5)]


@pytest.fixture(scope="module")
def trained(translation_folder):
    model = AutoModelForSeq2SeqLM.from_pretrained(translation_folder).eval()
    return model, AutoTokenizer.from_pretrained(translation_folder)


@pytest.fixture(scope="module")
def ct2_folders(translation_folder, tmp_path_factory):
    """The folder exported by the command line, in float32 and int8."""
    folders = {}
    for quantization in ("float32", "int8"):
        folders[quantization] = tmp_path_factory.mktemp("ct2") / quantization
        export_main(["ctranslate2", str(translation_folder), str(folders[quantization]),
                     "--quantization", quantization])
    return folders


def translator(folder) -> ctranslate2.Translator:
    """CTranslate2 sets the OpenMP thread count it shares with torch, by default to its own choice: given torch's
    count, it leaves torch's as it was for the tests that follow."""
    return ctranslate2.Translator(str(folder), device="cpu", intra_threads=torch.get_num_threads())


def source_tokens(tokenizer) -> list[list[str]]:
    return [tokenizer.convert_ids_to_tokens(tokenizer(source)["input_ids"]) for source, _ in PAIRS]


def generated_tokens(model, tokenizer, **kwargs) -> tuple[list[list[str]], int]:
    """`generate()`'s outputs as CTranslate2 gives them (no start token, no EOS), and the length limit it used."""
    inputs = tokenizer([source for source, _ in PAIRS], padding=True, return_tensors="pt")
    limit = int(inputs["attention_mask"].sum(-1).max()) + 50  # §6.1, as generate() sets it for this batch
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=limit, **kwargs)
    hypotheses = []
    for row in output[:, 1:].tolist():
        row = row[: row.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in row else row
        hypotheses.append(tokenizer.convert_ids_to_tokens([i for i in row if i != tokenizer.pad_token_id]))
    return hypotheses, limit


def token_log_probs(model, tokenizer) -> torch.Tensor:
    """log P of every reference token (EOS included), teacher-forced, concatenated over the pairs."""
    scores = []
    with torch.no_grad():
        for source, target in PAIRS:
            inputs = tokenizer(source, text_target=target, return_tensors="pt")
            log_probs = model(**inputs).logits.float().log_softmax(-1)[0]
            scores.append(log_probs.gather(-1, inputs["labels"][0, :, None])[:, 0])
    return torch.cat(scores)


def ct2_log_probs(folder, tokenizer) -> torch.Tensor:
    targets = [tokenizer.convert_ids_to_tokens(tokenizer(text_target=target)["input_ids"])[:-1] for _, target in PAIRS]
    results = translator(folder).score_batch(source_tokens(tokenizer), targets)
    return torch.cat([torch.tensor(result.log_probs) for result in results])


def recorded(translate_batch, calls: list) -> SimpleNamespace:
    """A translator whose translate_batch appends (rows, options) to `calls`, then calls `translate_batch`."""
    def record(batch, **options):
        calls.append((len(batch), options))
        return translate_batch(batch, **options)

    return SimpleNamespace(translate_batch=record)


def test_ctranslate2_greedy_translations_equal_ours_token_for_token(trained, ct2_folders):
    model, tokenizer = trained
    ours, limit = generated_tokens(model, tokenizer, num_beams=1)
    engine = translator(ct2_folders["float32"])
    theirs = [result.hypotheses[0] for result in
              engine.translate_batch(source_tokens(tokenizer), beam_size=1, max_decoding_length=limit)]
    assert len({" ".join(tokens) for tokens in ours}) > 10  # real, varied translations
    assert theirs == ours


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_ctranslate2_beam_4_equals_generate_with_the_same_length_penalty(trained, ct2_folders, alpha):
    """Both divide a hypothesis' log-probability by |Y|^alpha (not the paper's GNMT penalty, gnmt.py)."""
    model, tokenizer = trained
    ours, limit = generated_tokens(model, tokenizer, num_beams=4, length_penalty=alpha)
    engine = translator(ct2_folders["float32"])
    theirs = [result.hypotheses[0] for result in engine.translate_batch(
        source_tokens(tokenizer), beam_size=4, length_penalty=alpha, max_decoding_length=limit)]
    assert theirs == ours


def test_ctranslate2_scores_every_token_as_ours_does(trained, ct2_folders):
    model, tokenizer = trained
    torch.testing.assert_close(ct2_log_probs(ct2_folders["float32"], tokenizer), token_log_probs(model, tokenizer),
                               atol=1e-4, rtol=0)


def test_ctranslate2_scores_with_a_converted_models_position_table(translation_folder, tmp_path):
    """The same weights with fairseq's sinusoid table (layout, frequencies, offset: a converted model's options):
    the export carries that table, and CTranslate2 scores every token as ours does."""
    model = AutoModelForSeq2SeqLM.from_pretrained(translation_folder, position_encoding_layout="halves",
                                                  position_encoding_frequencies="fairseq", position_offset=2).eval()
    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    export_ctranslate2(model, tokenizer, str(tmp_path / "ct2"))
    ours = token_log_probs(model, tokenizer)
    torch.testing.assert_close(ct2_log_probs(tmp_path / "ct2", tokenizer), ours, atol=1e-4, rtol=0)
    paper = AutoModelForSeq2SeqLM.from_pretrained(translation_folder).eval()
    assert not torch.allclose(token_log_probs(paper, tokenizer), ours, atol=1e-2)  # the table matters


@pytest.mark.parametrize("options", [{"normalize_before": True},
                                     {"position_embedding": "learned", "max_position_embeddings": 64},
                                     {"d_k": 4, "d_v": 4}, {"scale_embedding": False}, {"layer_norm_eps": 0.1}],
                         ids=["pre-LN", "learned positions", "heads narrower than d_model / h", "unscaled embeddings",
                              "another LayerNorm epsilon"])
def test_ctranslate2_scores_a_model_beyond_the_papers_defaults_as_ours_does(translation_folder, tmp_path, options):
    """What the export writes beyond the paper's model: a pre-LN stack's final LayerNorm, learned positions
    (Table 3, row E), heads of d_k < d_model / h (row B), embeddings not scaled by sqrt(d_model) and another LayerNorm
    epsilon (converted models). Random weights, every LayerNorm's drawn too, so that each must reach the export."""
    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    model = tiny_model(seed=5, vocab_size=len(tokenizer), **options)
    with torch.no_grad():
        for norm in (module for module in model.modules() if isinstance(module, torch.nn.LayerNorm)):
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.3)
    export_ctranslate2(model, tokenizer, str(tmp_path / "ct2"))
    torch.testing.assert_close(ct2_log_probs(tmp_path / "ct2", tokenizer), token_log_probs(model, tokenizer),
                               atol=1e-4, rtol=0)


def test_ctranslate2_int8_errs_no_more_than_twice_our_own_int8(trained, ct2_folders):
    """Against float32 log-probabilities of the reference tokens. With 8-bit weights, CTranslate2's int8 products
    saturate on CPUs without VNNI and err about 17 times more than ours (to_ctranslate2.py)."""
    model, tokenizer = trained
    reference = token_log_probs(model, tokenizer)
    ours = (token_log_probs(quantize_int8(model), tokenizer) - reference).abs().mean()
    theirs = (ct2_log_probs(ct2_folders["int8"], tokenizer) - reference).abs().mean()
    assert 0 < theirs < 2 * ours, (theirs, ours)


def test_the_command_lines_int8_export_holds_a_byte_for_each_layer_weight(trained, ct2_folders):
    """`--quantization int8` reaches CTranslate2: the layers' matrices take one byte a weight instead of float32's
    four, so model.bin is at least 3 bytes a weight smaller."""
    model, _ = trained
    weights = sum(module.weight.numel() for module in model.modules()
                  if isinstance(module, torch.nn.Linear) and module is not model.lm_head)
    sizes = {quantization: (folder / "model.bin").stat().st_size for quantization, folder in ct2_folders.items()}
    assert sizes["float32"] - sizes["int8"] >= 3 * weights, (sizes, weights)


def test_int8_weights_keep_to_7_bits_and_a_row_of_zeros_stays_zero():
    """A fresh model's padding embedding is a row of zeros: its scale must stay finite (63 / 0 is not), 1 as in
    CTranslate2's own quantization; so must a row of float32's subnormals (63 / 1e-40 overflows)."""
    weight = np.array([[0.5, -0.3, 0.1], [0.0, 0.0, 0.0], [-2e-30, 0.6e-30, 0.0], [1e-40, 0.0, 0.0]],
                      dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns on an overflowing scale and on casting NaN to int8
        quantized, scale = seven_bits(weight)
    assert np.isfinite(scale).all() and scale.dtype == np.float32 and scale[1] == 1
    assert quantized.tolist()[:2] == [[63, -38, 13], [0, 0, 0]]  # round(w · 63 / max |w|)
    assert np.abs(quantized[2]).max() == 63  # a tiny row keeps its shape
    assert (np.abs(quantized / scale[:, None] - weight) <= 0.5 / scale[:, None]).all()  # half a step at most


@pytest.mark.parametrize("quantization", ["int8", "int8_float32", "int8_float16", "int8_bfloat16"])
def test_every_int8_export_keeps_its_weights_to_7_bits(trained, quantization):
    """CTranslate2's four int8 types quantize the same weights to 8 bits; ours keep each to 7 (to_ctranslate2.py)."""
    model, tokenizer = trained
    spec = VaswaniConverter(model, tokenizer)._load()
    spec.validate()  # as CTranslate2's Converter.convert: the weights as its variables, then quantized
    spec.optimize(quantization)
    peaks = []

    def peak(_, name, value):
        if name.endswith("/weight") and isinstance(value, Variable) and value.dtype == "int8":
            peaks.append(np.abs(value.numpy().astype(np.int16)).max())

    visit_spec(spec, peak)
    assert len(peaks) >= 6 * model.config.num_layers and max(peaks) == 63, peaks


def test_exporting_leaves_the_model_untouched(trained, tmp_path):
    """CTranslate2 quantizes the arrays it is given in place; the export gives it a copy, and leaves the model's
    mode as it was."""
    model, tokenizer = trained
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    model.train()
    try:
        export_ctranslate2(model, tokenizer, tmp_path / "ct2", quantization="int8")
        assert model.training
    finally:
        model.eval()
    assert all(torch.equal(tensor, before[name]) for name, tensor in model.state_dict().items())


def test_ctranslate2s_own_converter_finds_our_loader(translation_folder, trained, ct2_folders, tmp_path):
    _, tokenizer = trained
    TransformersConverter(str(translation_folder)).convert(str(tmp_path / "ct2"))
    sources = source_tokens(tokenizer)[:8]
    translations = [[result.hypotheses[0] for result in translator(folder).translate_batch(sources)]
                    for folder in (tmp_path / "ct2", ct2_folders["float32"])]
    assert translations[0] == translations[1]


def test_the_exported_folder_carries_the_tokenizer(trained, ct2_folders):
    _, tokenizer = trained
    copied = AutoTokenizer.from_pretrained(ct2_folders["float32"])
    assert copied(PAIRS[0][0])["input_ids"] == tokenizer(PAIRS[0][0])["input_ids"]


def test_the_ctranslate2_engine_translates_greedily_as_the_torch_engine(translation_folder, cli, tmp_path,
                                                                        monkeypatch):
    """`vaswani-translate --engine ctranslate2`: the folder converted once into the cache, then CTranslate2 decodes;
    with one beam its output is the torch engine's, line for line (sources of the embedded pairs, and a sentence of
    one repeated word). The progress bar names the engine."""
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    sources = "\n".join([source for source, _ in PAIRS] + ["dog " * 30]) + "\n"
    torch_engine = cli("--model", translation_folder, "--num_beams", "1", stdin=sources)
    ct2_engine = cli("--model", translation_folder, "--num_beams", "1", "--engine", "ctranslate2", stdin=sources)
    assert ct2_engine.returncode == 0, ct2_engine.stderr
    assert len(set(torch_engine.stdout.splitlines())) > 10 and ct2_engine.stdout == torch_engine.stdout
    assert "ctranslate2: 41 lines" in ct2_engine.stderr and "torch: 41 lines" in torch_engine.stderr
    assert len([path for path in (tmp_path / "cache" / "ctranslate2").iterdir() if path.is_dir()]) == 1


@pytest.mark.parametrize("eos_bias", [30.0, 0.0, -30.0])
def test_the_ctranslate2_engine_decodes_greedily_the_torch_engines_ids(translation_folder, trained, tmp_path,
                                                                       monkeypatch, eos_bias):
    """`decode` with one beam, on a batch of sources of other lengths (one of 1,060 tokens, past CTranslate2's default
    cut of 1,024), gives the torch engine's ids, EOS included: as trained; with a bias for EOS (each output one
    token and EOS: an empty output is not allowed); with a bias against it (each runs to its own source's length +
    50, the longest cut where the export's table of positions ends; + 9 where the generation config's `extra_length`
    says 9)."""
    from vaswani_hf.exports.to_ctranslate2 import POSITIONS
    from vaswani_hf.tools.ctranslate2_engine import CTranslate2Engine
    from vaswani_hf.tools.translate import TorchEngine

    _, tokenizer = trained
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    folder = Path(shutil.copytree(translation_folder, tmp_path / "biased"))
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, add_final_logits_bias=True).eval()
    model.final_logits_bias[0, tokenizer.eos_token_id] = eos_bias
    model.save_pretrained(folder)
    long = tokenizer(" ".join(source for source, _ in generate()["test"][:120]))["input_ids"][-1060:]
    batch = [*tokenizer([source for source, _ in PAIRS[:8]] + ["dog " * 30])["input_ids"], long]
    torch_engine, ct2_engine = TorchEngine(model, tokenizer), CTranslate2Engine(str(folder), model.config, tokenizer)
    ours, _ = torch_engine.decode(batch, 1, 0.6, 1)
    theirs, _ = ct2_engine.decode(batch, 1, 0.6, 1)
    assert theirs == [hypothesis[:POSITIONS] for hypothesis in ours]
    ended = [hypothesis[-1] == tokenizer.eos_token_id for hypothesis in ours]
    if eos_bias > 0:
        assert all(ended) and {len(hypothesis) for hypothesis in ours} == {2}
    if eos_bias < 0:
        assert not any(ended) and [len(hypothesis) for hypothesis in ours] == [len(ids) + 50 for ids in batch]
        torch_engine.generation_config.extra_length = ct2_engine.generation_config.extra_length = 9
        short = batch[:-1]  # the 1,060-token source left out: its + 50 decoded once is enough
        ours, _ = torch_engine.decode(short, 1, 0.6, 1)
        assert ct2_engine.decode(short, 1, 0.6, 1)[0] == ours == [hypothesis[: len(ids) + 9]
                                                                    for hypothesis, ids in zip(theirs, short)]


# A value of each generation setting that makes a logits processor or stopping criterion CTranslate2 has not.
UNAPPLIED = {"encoder_repetition_penalty": 1.2, "encoder_no_repeat_ngram_size": 2, "sequence_bias": [[[5], -1.0]],
             "suppress_tokens": [5], "begin_suppress_tokens": [5], "forced_bos_token_id": 5,
             "renormalize_logits": True, "remove_invalid_values": True, "exponential_decay_length_penalty": (2, 1.5),
             "watermarking_config": {"bias": 2.0}, "stop_strings": ["."]}


@pytest.mark.parametrize("setting", UNAPPLIED)
def test_the_ctranslate2_engine_refuses_each_generation_setting_it_does_not_apply(translation_folder, tmp_path,
                                                                                    setting):
    """Every processor and stopping setting of the paper's search but the four CTranslate2 has (banned words, no
    repeated n-grams, a repetition penalty, a forced end) is refused in one line before anything is converted: decoded
    without it, the translations would differ without a word."""
    from vaswani_hf.gnmt import PROCESSOR_SETTINGS, STOPPING_SETTINGS
    from vaswani_hf.tools.ctranslate2_engine import APPLIED, CTranslate2Engine

    assert set(UNAPPLIED) == set(PROCESSOR_SETTINGS + STOPPING_SETTINGS) - set(APPLIED)
    folder = shutil.copytree(translation_folder, tmp_path / "model")
    GenerationConfig.from_pretrained(folder, **{setting: UNAPPLIED[setting]}).save_pretrained(folder)
    config, tokenizer = AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    with pytest.raises(ValueError, match=f"^--engine ctranslate2 does not apply the generation config's {setting}="):
        CTranslate2Engine(str(folder), config, tokenizer)


def test_the_ctranslate2_engine_applies_a_generation_configs_no_repeat_ngram_size_and_repetition_penalty(
        translation_folder, trained, tmp_path, monkeypatch):
    """Both are CTranslate2's own options: with a bias against EOS (outputs that run to their limit and repeat
    themselves), greedy decoding gives the torch engine's ids, which transformers' processors make: free of a repeated
    bigram, and, penalized, other than without the penalty (the greedy search penalizes logits, as transformers'
    does and CTranslate2's)."""
    from vaswani_hf.tools.ctranslate2_engine import CTranslate2Engine
    from vaswani_hf.tools.translate import TorchEngine

    def repeats(ids):
        return len(set(itertools.pairwise(ids))) < len(ids) - 1

    _, tokenizer = trained
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    model = AutoModelForSeq2SeqLM.from_pretrained(translation_folder, add_final_logits_bias=True).eval()
    model.final_logits_bias[0, tokenizer.eos_token_id] = -30.0
    batch = tokenizer([source for source, _ in PAIRS[:8]])["input_ids"]
    plain, _ = TorchEngine(model, tokenizer).decode(batch, 1, 0.6, 1)
    assert any(repeats(ids) for ids in plain)
    for setting, value in (("no_repeat_ngram_size", 2), ("repetition_penalty", 1.5)):
        folder = Path(shutil.copytree(translation_folder, tmp_path / setting))
        setattr(model.generation_config, setting, value)
        model.save_pretrained(folder)
        ours, _ = TorchEngine(model, tokenizer).decode(batch, 1, 0.6, 1)
        assert CTranslate2Engine(str(folder), model.config, tokenizer).decode(batch, 1, 0.6, 1)[0] == ours != plain
        if setting == "no_repeat_ngram_size":
            assert not any(repeats(ids) for ids in ours)
        setattr(model.generation_config, setting, None)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_batch_in_two_parts_at_once_translates_as_one_batch(translation_folder, tmp_path, monkeypatch, num_beams):
    """What `kept_workers` may choose, each batch decoded in two parts at once by two workers of one thread (each
    part at most half the batch), gives one worker's translations, and its scores to float32's rounding (a part's
    products have other shapes), greedy and beam 4."""
    from vaswani_hf.tools.ctranslate2_engine import CTranslate2Engine
    from vaswani_hf.tools.translate import translations

    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    config = AutoConfig.from_pretrained(translation_folder)
    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    sources = [source for source, _ in PAIRS] + ["dog " * 30]
    found = []
    for parts in (1, 2):
        engine = CTranslate2Engine(str(translation_folder), config, tokenizer,
                                   workers={"inter_threads": parts, "intra_threads": 1})
        assert engine.translator.num_translators == parts
        calls = []
        engine.translator = recorded(engine.translator.translate_batch, calls)
        found.append(sorted(translations(engine, tokenizer, sources, num_beams=num_beams)))
        assert calls and all(options["max_batch_size"] == -(-rows // parts) for rows, options in calls)
    texts = [[(t.index, [text for text, _ in t.hypotheses]) for t in run] for run in found]
    assert len(texts[0]) == len(sources) and texts[1] == texts[0]
    scores = [[score for t in run for _, score in t.hypotheses] for run in found]
    assert scores[1] == pytest.approx(scores[0], rel=1e-5)


def test_the_probe_times_greedy_translations_of_16_tokens_in_a_part_per_worker():
    from vaswani_hf.tools.ctranslate2_engine import probe_seconds

    calls = []
    for parts in (1, 2, 3):
        assert probe_seconds(recorded(lambda batch, **options: None, calls), [["▁a"] * 24] * 16, parts, 16) >= 0
    greedy = {"beam_size": 1, "min_decoding_length": 16, "max_decoding_length": 16}
    assert calls == [(16, {**greedy, "max_batch_size": size}) for size in (16, 8, 6)]


def test_the_ctranslate2_cache_is_keyed_by_what_the_export_is_made_from(translation_folder, tmp_path, monkeypatch):
    """The same folder twice: one conversion, reused. The folder with one weight changed: a conversion of its own,
    which decodes what the changed weights say. A changed configuration or tokenizer file, quantization,
    CTranslate2 version or converter: each a conversion of its own. A cached export without its model.bin is made
    again. Each is converted from the model as its files are written, not as fast_cpu would transform it."""
    from safetensors.torch import load_file, save_file

    from vaswani_hf.exports import to_ctranslate2
    from vaswani_hf.tools import loading
    from vaswani_hf.tools.ctranslate2_engine import cached_export

    def transformed(*args, **kwargs):
        raise AssertionError("exported from the model fast_cpu transformed")

    monkeypatch.setattr(loading, "fast_cpu", transformed)
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    first = cached_export(str(translation_folder), "float32")
    written = (first / "model.bin").stat().st_mtime_ns
    assert cached_export(str(translation_folder), "float32") == first
    assert (first / "model.bin").stat().st_mtime_ns == written  # not converted again
    changed = tmp_path / "changed"
    shutil.copytree(translation_folder, changed)
    weights = load_file(changed / "model.safetensors")
    weights["model.encoder.layers.0.fc1.bias"] += 1.0
    save_file(weights, changed / "model.safetensors", metadata={"format": "pt"})
    exports = {first, cached_export(str(changed), "float32"), cached_export(str(translation_folder), "int8")}
    for name in ("config.json", "tokenizer.json"):
        edited = Path(shutil.copytree(translation_folder, tmp_path / name))
        with open(edited / name, "a", encoding="utf-8") as file:
            file.write("\n")
        exports.add(cached_export(str(edited), "float32"))
    converter = tmp_path / "to_ctranslate2.py"
    converter.write_text(Path(to_ctranslate2.__file__).read_text(encoding="utf-8") + "\n# changed\n", encoding="utf-8")
    monkeypatch.setattr(to_ctranslate2, "__file__", str(converter))
    exports.add(cached_export(str(translation_folder), "float32"))
    monkeypatch.setattr(ctranslate2, "__version__", "0.1")
    exports.add(cached_export(str(translation_folder), "float32"))
    assert len(exports) == 7
    monkeypatch.undo()
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    (first / "model.bin").unlink()
    assert cached_export(str(translation_folder), "float32") == first and (first / "model.bin").is_file()


def test_a_model_saved_in_shards_translates_as_in_one_file_and_each_shard_keys_its_export(
        translation_folder, trained, tmp_path, monkeypatch):
    """Weights in shards (model.safetensors.index.json and the files it names, as save_pretrained writes a large
    model): the engine converts them and translates as from one file; a changed shard makes a new export."""
    from safetensors.torch import load_file, save_file

    from vaswani_hf.tools.ctranslate2_engine import CTranslate2Engine, cached_export

    model, tokenizer = trained
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    sharded = tmp_path / "sharded"
    shutil.copytree(translation_folder, sharded, ignore=shutil.ignore_patterns("model.safetensors"))
    model.save_pretrained(sharded, max_shard_size="100KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1 and (sharded / "model.safetensors.index.json").is_file()
    batch = tokenizer([source for source, _ in PAIRS])["input_ids"]
    found = [CTranslate2Engine(str(folder), model.config, tokenizer).decode(batch, 1, 0.6, 1)[0]
             for folder in (translation_folder, sharded)]
    assert found[1] == found[0]
    exported = cached_export(str(sharded), "float32")
    weights = load_file(shards[-1])
    name = next(iter(weights))
    weights[name] += 1.0
    save_file(weights, shards[-1], metadata={"format": "pt"})
    assert cached_export(str(sharded), "float32") != exported


def test_an_export_asked_for_twice_at_once_is_converted_once(translation_folder, tmp_path, monkeypatch):
    """Two translations started together on an empty cache: one converts, the other waits and takes its export."""
    from concurrent.futures import ThreadPoolExecutor

    from vaswani_hf.exports import to_ctranslate2
    from vaswani_hf.tools.ctranslate2_engine import cached_export

    conversions, convert = [], to_ctranslate2.export

    def slow_export(*args, **kwargs):  # the second asks while the first converts
        conversions.append(args)
        time.sleep(1)
        return convert(*args, **kwargs)

    monkeypatch.setattr(to_ctranslate2, "export", slow_export)
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    with ThreadPoolExecutor(2) as pool:
        found = list(pool.map(lambda _: cached_export(str(translation_folder), "float32"), range(2)))
    assert found[0] == found[1] and (found[0] / "model.bin").is_file() and len(conversions) == 1


@pytest.mark.parametrize(("one_thread", "parts", "expected"), [(0.5, 0.9, (1, 1)), (0.98, 0.5, (2, 1)),
                                                               (1.5, 0.98, (1, 2)), (0.5, 0.3, (2, 1))])
def test_ctranslates_workers_are_measured_once_per_export_and_taken_only_when_they_pay(
        trained, ct2_folders, monkeypatch, one_thread, parts, expected):
    """One batch on two threads; one on one thread; or two parts of it at once, one thread each: by greedy
    translations of a probe (faked times: two threads take 1 s), each taken over the one chosen before it only at
    97% of its time or less; the choice kept beside the export with each one's best timed round, and read back;
    another compute type, CPU, thread count or rule measured again. The probe's sources are words, no special
    tokens."""
    from vaswani_hf.tools import ctranslate2_engine

    _, tokenizer = trained
    copy = Path(ct2_folders["float32"]).parent / f"workers-{one_thread}-{parts}"
    folder = Path(shutil.copytree(ct2_folders["float32"], copy))
    probes, translators = [], []

    def probe_seconds(translator, sources, in_parts, tokens):  # warmed up in turn: two threads, one thread, two parts
        assert len(sources) == 16 and all(len(row) == 24 for row in sources) and tokens == 16
        assert not {token for row in sources for token in row} & set(tokenizer.all_special_tokens)  # words only
        if translator not in translators:
            translators.append(translator)
        candidate = translators.index(translator)
        assert in_parts == (1, 1, torch.get_num_threads())[candidate]  # a part for each of the threads
        slower = 1 + probes.count(translator) / 100  # each round 1% slower than the one before: the best is kept
        probes.append(translator)
        return (1.0, one_thread, parts)[candidate] * slower

    monkeypatch.setattr(ctranslate2_engine, "probe_seconds", probe_seconds)
    threads = torch.get_num_threads()
    workers = {"inter_threads": expected[0], "intra_threads": expected[1]}
    try:  # kept_workers leaves torch with the count it is given: 2, then 3
        probed = 3 * (1 + ROUNDS)  # a warm-up round and the timed rounds, three candidates
        assert ctranslate2_engine.kept_workers(folder, "float32", 2, tokenizer) == workers
        assert len(probes) == probed
        [kept] = [json.loads(path.read_text(encoding="utf-8")) for path in (folder / "threads").glob("*.json")]
        assert kept["seconds"] == pytest.approx([1.01, one_thread * 1.01, parts * 1.01])  # the first timed round
        assert ctranslate2_engine.kept_workers(folder, "float32", 2, tokenizer) == workers
        assert len(probes) == probed  # kept, read back
        translators.clear()
        ctranslate2_engine.kept_workers(folder, "int8", 2, tokenizer)  # another compute type
        assert len(probes) == 2 * probed
        translators.clear()
        monkeypatch.setattr(ctranslate2_engine, "cpu_name", lambda: "another CPU")
        ctranslate2_engine.kept_workers(folder, "float32", 2, tokenizer)
        assert len(probes) == 3 * probed
        translators.clear()
        ctranslate2_engine.kept_workers(folder, "float32", 3, tokenizer)  # another thread count
        assert len(probes) == 4 * probed
        translators.clear()
        monkeypatch.setattr(fast_cpu_module, "ROUNDS", 3)  # chosen by another rule: measured again
        ctranslate2_engine.kept_workers(folder, "float32", 3, tokenizer)
        assert len(probes) == 4 * probed + 3 * (1 + 3)
    finally:
        torch.set_num_threads(threads)


def test_a_workers_probe_is_one_greedy_translation_of_its_tokens_in_a_batch_for_each_part():
    from vaswani_hf.tools.ctranslate2_engine import probe_seconds

    calls = []
    translator = type("Translator", (), {"translate_batch": lambda self, sources, **options: calls.append(options)})()
    assert probe_seconds(translator, [["a"]] * 16, 3, 12) >= 0
    assert calls == [{"beam_size": 1, "min_decoding_length": 12, "max_decoding_length": 12, "max_batch_size": 6}]


def test_the_engine_measures_workers_only_on_a_cpu_with_threads_to_share_and_leaves_torchs_count(
        translation_folder, trained, tmp_path, monkeypatch):
    """On a CPU with two threads the workers are measured (`kept_workers`) and torch keeps its two threads though
    CTranslate2 is given one; with one thread, or on a GPU, one batch at a time on all threads, not measured. On a
    GPU CTranslate2 gets the device's index, and int8 weights with float16 activations (CTranslate2's int8 on
    CUDA). A folder without generation_config.json decodes with the one transformers makes for the torch model."""
    from transformers import GenerationConfig

    from vaswani_hf.tools import ctranslate2_engine

    model, tokenizer = trained
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    measured = []
    monkeypatch.setattr(ctranslate2_engine, "kept_workers", lambda *args: measured.append(args[1:3]) or {
        "inter_threads": 2, "intra_threads": 1})
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        engine = ctranslate2_engine.CTranslate2Engine(str(translation_folder), model.config, tokenizer)
        assert measured == [("float32", 2)] and engine.workers == {"inter_threads": 2, "intra_threads": 1}
        assert engine.translator.num_translators == 2 and torch.get_num_threads() == 2
        torch.set_num_threads(1)
        engine = ctranslate2_engine.CTranslate2Engine(str(translation_folder), model.config, tokenizer)
        assert len(measured) == 1 and engine.workers == {"inter_threads": 1, "intra_threads": 1}
        torch.set_num_threads(2)
        made = []
        monkeypatch.setattr(ctranslate2, "Translator", lambda *args, **kwargs: made.append(kwargs))
        ctranslate2_engine.CTranslate2Engine(str(translation_folder), model.config, tokenizer, "cuda:1", int8=True)
        assert len(measured) == 1 and made == [{"device": "cuda", "device_index": 1, "compute_type": "int8_float16",
                                                "inter_threads": 1, "intra_threads": 2}]
    finally:
        torch.set_num_threads(threads)
    bare = Path(shutil.copytree(translation_folder, tmp_path / "bare",
                                ignore=shutil.ignore_patterns("generation_config.json")))
    torch_model = AutoModelForSeq2SeqLM.from_pretrained(bare)
    engine = ctranslate2_engine.CTranslate2Engine(str(bare), torch_model.config, tokenizer, workers={
        "inter_threads": 1, "intra_threads": 1})
    decoding = ("_from_model_config", "num_beams", "length_penalty", "max_length", "decoder_start_token_id",
                "eos_token_id", "pad_token_id")  # what translations() and the engines read
    assert isinstance(engine.generation_config, GenerationConfig) and engine.generation_config._from_model_config
    assert ({key: getattr(engine.generation_config, key) for key in decoding}
            == {key: getattr(torch_model.generation_config, key) for key in decoding})


def test_the_ctranslate2_engine_gives_nbest_lines_and_int8(translation_folder, cli, tmp_path, monkeypatch):
    """Beam 4 with its n best, in the torch engine's format ("line ||| translation ||| score", best first, with
    CTranslate2's scores), and its int8 export: a line for every source."""
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    sources = "\n".join(source for source, _ in PAIRS[:6]) + "\n"
    nbest = cli("--model", translation_folder, "--engine", "ctranslate2", "--nbest", "2", stdin=sources)
    lines = [line.split(" ||| ") for line in nbest.stdout.splitlines()]
    assert [int(line[0]) for line in lines] == [i for i in range(6) for _ in range(2)]
    assert all(float(lines[k][2]) >= float(lines[k + 1][2]) for k in range(0, 12, 2))
    int8 = cli("--model", translation_folder, "--engine", "ctranslate2", "--int8", stdin=sources)
    assert int8.returncode == 0 and len(int8.stdout.splitlines()) == 6


def test_the_ctranslate2_engine_scores_translations_as_ctranslate2_does_and_as_the_torch_engine(
        translation_folder, trained, ct2_folders, cli, tmp_path, monkeypatch):
    """--score on the CTranslate2 engine: each line the sum of CTranslate2's own `score_batch` of the export (its
    tokens, EOS added by it), and the torch engine's line; its int8 export scores a line a pair too."""
    _, tokenizer = trained
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    pairs = PAIRS[:12]
    (tmp_path / "in.txt").write_text("".join(source + "\n" for source, _ in pairs), encoding="utf-8")
    (tmp_path / "de.txt").write_text("".join(target + "\n" for _, target in pairs), encoding="utf-8")
    args = ["--model", translation_folder, "--input", tmp_path / "in.txt", "--score", tmp_path / "de.txt", "--quiet"]
    lines = {}
    for engine in ("torch", "ctranslate2"):
        result = cli(*args, "--engine", engine)
        assert result.returncode == 0, result.stderr
        lines[engine] = [float(line) for line in result.stdout.splitlines()]
    found = translator(ct2_folders["float32"]).score_batch(
        source_tokens(tokenizer)[:12], [tokenizer.tokenize(target) for _, target in pairs])
    assert lines["ctranslate2"] == pytest.approx([sum(result.log_probs) for result in found], abs=1e-4)
    assert lines["ctranslate2"] == pytest.approx(lines["torch"], abs=1e-3)
    int8 = cli(*args, "--engine", "ctranslate2", "--int8")
    assert int8.returncode == 0 and len(int8.stdout.splitlines()) == len(pairs), int8.stderr


@pytest.mark.parametrize("length_penalty", [None, 0.0, 0.6])
def test_without_gnmt_alpha_the_ctranslate2_engine_scores_log_p_over_length_to_the_configs_penalty(
        translation_folder, trained, tmp_path, monkeypatch, length_penalty):
    """A generation config without `gnmt_alpha` (a model decoded as published): each of the engine's n best scores
    log P (EOS included, as the torch model gives it) / |Y|^length_penalty, where unset generate()'s default of 1, and
    stops within its own source's length + 50 tokens (§6.1), in a batch of sources of other lengths."""
    from vaswani_hf.tools.ctranslate2_engine import CTranslate2Engine

    model, tokenizer = trained
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    folder = Path(shutil.copytree(translation_folder, tmp_path / "published"))
    settings = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    del settings["gnmt_alpha"]
    if length_penalty is not None:
        settings["length_penalty"] = length_penalty
    (folder / "generation_config.json").write_text(json.dumps(settings), encoding="utf-8")
    engine = CTranslate2Engine(str(folder), AutoConfig.from_pretrained(folder), tokenizer)
    batch = tokenizer([source for source, _ in PAIRS[:6]] + ["dog " * 30, "dog " * 4])["input_ids"]
    hypotheses, scores = engine.decode(batch, num_beams=4, alpha=None, nbest=2)
    assert len(hypotheses) == 2 * len(batch)
    for k, (hypothesis, score) in enumerate(zip(hypotheses, scores)):
        source = batch[k // 2]
        assert len(hypothesis) <= len(source) + 50
        with torch.no_grad():
            labels = torch.tensor([hypothesis])
            log_probs = model(input_ids=torch.tensor([source]), labels=labels).logits.log_softmax(-1)
        log_p = log_probs[0].gather(-1, labels[0, :, None]).sum().item()
        penalty = len(hypothesis) ** (1.0 if length_penalty is None else length_penalty)
        assert score == pytest.approx(log_p / penalty, rel=1e-3)


def test_the_ctranslate2_engine_refuses_in_one_line(translation_folder, cli, monkeypatch, tmp_path):
    """A device CTranslate2 does not run on or cannot find, a source longer than the export's table of sinusoids (the
    torch model computes any), a folder without its weights, and a missing package (named with the line that installs
    it)."""
    from vaswani_hf.exports.to_ctranslate2 import POSITIONS

    assert cli("--model", translation_folder, "--engine", "ctranslate2", "--device", "meta",
               stdin="A dog.\n").stderr.strip() == "error: --device meta: CTranslate2 runs on cpu or cuda"
    import ctranslate2

    for gpus, device, message in ((0, "cuda", "this machine has no CUDA GPU that CTranslate2 can use"),
                                  (2, "cuda:2", "CTranslate2 can use cuda:0 to cuda:1 here")):
        with monkeypatch.context() as patched:  # not the model's fault
            patched.setattr(ctranslate2, "get_cuda_device_count", lambda gpus=gpus: gpus)
            assert cli("--model", translation_folder, "--engine", "ctranslate2", "--device", device,
                       stdin="A dog.\n").stderr.strip() == f"error: --device {device}: {message}"
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    long = cli("--model", translation_folder, "--engine", "ctranslate2", stdin="A dog.\n" + "dog " * POSITIONS + "\n")
    assert long.stderr.strip() == (f"error: line 2 has {POSITIONS + 1} tokens; this model's positions stop at "
                                   f"{POSITIONS} on the ctranslate2 engine")
    weightless = tmp_path / "weightless"
    shutil.copytree(translation_folder, weightless, ignore=shutil.ignore_patterns("model.safetensors"))
    refused = cli("--model", weightless, "--engine", "ctranslate2", stdin="A dog.\n").stderr.strip()
    assert refused.startswith(f"error: cannot load a model from {weightless}: ") and "\n" not in refused
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 fails, as where it is not installed
    assert cli("--model", translation_folder, "--engine", "ctranslate2", stdin="A dog.\n").stderr.strip() == (
        'error: --engine ctranslate2 needs ctranslate2: pip install ctranslate2 (or pip install "vaswani_hf[export]")')


@pytest.mark.parametrize("gpus", [0, 1])
def test_the_ctranslate2_engines_auto_device_is_a_gpu_where_ctranslate2_counts_one(translation_folder, monkeypatch,
                                                                                    gpus):
    """vaswani-translate --engine ctranslate2 without --device: CTranslate2's CUDA build on a GPU it finds, else the
    CPU (the engine stood in for: it would convert the model)."""
    import ctranslate2

    from vaswani_hf.tools import ctranslate2_engine
    from vaswani_hf.tools.translate import load_engine

    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: gpus)
    monkeypatch.setattr(ctranslate2_engine, "CTranslate2Engine", lambda *args, scoring: args)
    (*_, device, int8), _ = load_engine(str(translation_folder), "ctranslate2")
    assert (device, int8) == ("cuda" if gpus else "cpu", False)


@pytest.mark.parametrize("engine", ["ctranslate2", "onnx", "marian"])
def test_export_refusals_are_one_line(translation_folder, tmp_path, engine):
    marian = tmp_path / "marian"
    save_marian_folder(marian)
    (tmp_path / "empty").mkdir()
    (tmp_path / "taken").mkdir()
    (tmp_path / "file").write_text("", encoding="utf-8")
    for arguments, message in (
            ([str(marian), str(tmp_path / "out")], (f"error: {marian} holds a 'marian' model, not a vaswani_hf one: "
                                                     f"convert it, vaswani-convert marian {marian} OUT")),
            ([str(tmp_path / "empty"), str(tmp_path / "out")], f"error: {tmp_path / 'empty'} is not a model folder"),
            ([str(translation_folder), str(tmp_path / "taken")], f"error: {tmp_path / 'taken'} exists: give a folder"),
            ([str(translation_folder), str(tmp_path / "file" / "out")],
             f"error: {tmp_path / 'file' / 'out'}: {tmp_path / 'file'} is a file"),
            ([str(translation_folder), " "], "error: the output folder is blank: give a folder"),  # not "." exists
            (["", str(tmp_path / "out")], "error: the model is blank: give its folder or Hub id"),
    ):
        with pytest.raises(SystemExit) as error:
            export_main([engine, *arguments])
        assert str(error.value).startswith(message) and "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()
    assert not any((tmp_path / "taken").iterdir())


@pytest.mark.parametrize(("fewer_rows", "d_k", "message"), [
    (0, 4, "CTranslate2 has one head width; this model has d_k=4, d_v=8"),  # Table 3's row (B): keys narrower
    (3, 8, "the tokenizer has {tokens} tokens but the model's vocabulary {rows}"),  # CTranslate2's drops the rest
])
def test_a_model_ctranslate2_cannot_hold_is_refused_in_one_line(translation_folder, tmp_path, fewer_rows, d_k,
                                                                 message):
    folder = tmp_path / "model"
    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    rows = len(tokenizer) - fewer_rows
    tiny_model(vocab_size=rows, d_k=d_k).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with pytest.raises(SystemExit) as error:
        export_main(["ctranslate2", str(folder), str(tmp_path / "out")])
    assert error.value.code == "error: " + message.format(tokens=len(tokenizer), rows=rows)
    assert not (tmp_path / "out").exists()


def test_an_export_that_fails_midway_leaves_nothing_under_its_name_and_a_full_disk_is_one_line(
        translation_folder, tmp_path, monkeypatch):
    from vaswani_hf.exports import to_ctranslate2

    def fail_after_a_file(stop: BaseException):
        def export(model, tokenizer, output_dir, quantization=None):
            Path(output_dir).mkdir()
            (Path(output_dir) / "model.bin").write_bytes(b"half")
            raise stop
        return export

    out = tmp_path / "exports" / "ct2"
    with monkeypatch.context() as patch:
        patch.setattr(to_ctranslate2, "export", fail_after_a_file(KeyboardInterrupt()))  # as a user stopping it
        with pytest.raises(KeyboardInterrupt):
            export_main(["ctranslate2", str(translation_folder), str(out)])
        assert not out.exists() and not any(out.parent.iterdir())  # the same command can be given again
        patch.setattr(to_ctranslate2, "export", fail_after_a_file(OSError(errno.ENOSPC, "No space left on device")))
        with pytest.raises(SystemExit) as stop:  # a full disk: one line
            export_main(["ctranslate2", str(translation_folder), str(out)])
        patch.chdir(out.parent)
        with pytest.raises(SystemExit) as relative:  # named as given
            export_main(["ctranslate2", str(translation_folder), "ct2"])
    assert relative.value.code.startswith("error: ct2 could not be written ([Errno 28]")
    assert stop.value.code == (f"error: {out} could not be written ([Errno 28] No space left on device); nothing of "
                               "it is left")
    assert not out.exists() and not any(out.parent.iterdir())
    export_main(["ctranslate2", str(translation_folder), str(out)])
    assert [path.name for path in out.parent.iterdir()] == ["ct2"]
    translator(out)


@pytest.mark.parametrize(("engine", "package"), [("ctranslate2", "ctranslate2"), ("onnx", "onnxscript")])
def test_a_missing_engine_is_named_with_the_command_that_installs_it(translation_folder, tmp_path, engine, package,
                                                                     capfd, monkeypatch):
    """In this process, the package made unimportable (None in sys.modules: `import` raises ModuleNotFoundError)."""
    monkeypatch.setitem(sys.modules, package, None)
    message = refusal(capfd, export_main, engine, translation_folder, tmp_path / "out")
    assert message == (f"error: vaswani-export {engine} needs {package}: pip install {package} "
                       '(or pip install "vaswani_hf[export]")')
    assert not (tmp_path / "out").exists()


# --- ONNX ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def onnx_model(translation_folder, tmp_path_factory):
    folder = tmp_path_factory.mktemp("onnx") / "model"
    export_main(["onnx", str(translation_folder), str(folder)])
    return OnnxSeq2Seq(folder, threads=torch.get_num_threads())  # as many as torch has, not one per core


def test_onnx_runtime_runs_each_graph_on_the_threads_asked_for(onnx_model):
    sessions = OnnxSeq2Seq(onnx_model.folder, threads=1).sessions.values()
    assert [session.get_session_options().intra_op_num_threads for session in sessions] == [1, 1, 1]


def test_onnx_runtime_workers_sleep_between_runs_not_spin(onnx_model):
    """The decoding loop's own work between two runs needs the cores that spinning workers would hold."""
    spinning = [session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
                for session in onnx_model.sessions.values()]
    assert spinning == ["0", "0", "0"]


def test_onnx_runtime_scores_translations_as_the_torch_model(onnx_model, trained):
    """`score` with the ONNX graphs: each pair's log P is the torch model's, in batches of several lengths."""
    from vaswani_hf.tools.translate import score

    model, tokenizer = trained
    sources, targets = [source for source, _ in PAIRS[:9]], [target for _, target in PAIRS[:9]]
    found = [pair.log_prob for pair in score(onnx_model, tokenizer, sources, targets, max_tokens=60)]
    assert found == pytest.approx([pair.log_prob for pair in score(model, tokenizer, sources, targets)], abs=1e-4)


def test_onnx_runtimes_decoding_step_transposes_no_cached_keys(onnx_model, tmp_path):
    """The step graph as ONNX Runtime runs it (its optimized graph, saved) transposes none of the keys it is given, of
    self- or encoder-decoder attention, nor their concatenation with the new position's: Q K^T takes them as they are
    (torch's exporter wrote SDPA as a copy of them all, transposed and scaled, at every step). A transpose is traced
    back through reshapes and concatenations to the graph's inputs."""
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    onnxruntime.InferenceSession(str(onnx_model.folder / "decoder_with_past_model.onnx"), options,
                                 providers=["CPUExecutionProvider"])
    graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    producers = {output: node for node in graph.node for output in node.output}

    def inputs_reached(name: str) -> set[str]:
        node = producers.get(name)
        if node is None:
            return {name}
        if node.op_type not in ("Reshape", "Concat", "Identity"):
            return set()
        return set().union(*(inputs_reached(given) for given in node.input[:1 if node.op_type == "Reshape" else None]))

    transposes = [node for node in graph.node if node.op_type == "Transpose"]
    assert transposes  # those of the new position's projections, at least
    cached = [inputs_reached(node.input[0]) for node in transposes]
    assert not [names for names in cached if any(name.startswith("past_key_values") for name in names)]


def test_the_onnx_export_traces_a_float32_eager_copy_and_leaves_the_model_as_it_was(translation_folder, tmp_path,
                                                                                     monkeypatch):
    """torch's exporter (stubbed: the module it is given) sees float32 and the eager attention, the formula, whose K^T
    ONNX Runtime takes into the product (SDPA is exported as a copy of the cached keys at every step); the model given
    stays bfloat16, SDPA and in training."""
    from vaswani_hf.exports import to_onnx

    traced = []
    monkeypatch.setattr(torch.onnx, "export", lambda module, *args, **kwargs: traced.append(module.model))
    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    model = tiny_model(vocab_size=len(tokenizer)).to(torch.bfloat16).train()
    assert model.config._attn_implementation == "sdpa"
    to_onnx.export(model, tokenizer, tmp_path / "onnx")
    assert [(graph.dtype, graph.config._attn_implementation, graph.training) for graph in traced] == [
        (torch.float32, "eager", False)] * 3
    assert (model.dtype, model.config._attn_implementation, model.training) == (torch.bfloat16, "sdpa", True)


def padded_sources(tokenizer):
    return tokenizer([source for source, _ in PAIRS[:12]], padding=True, return_tensors="pt")


def test_onnx_encoder_gives_torchs_output(trained, onnx_model):
    model, tokenizer = trained
    inputs = padded_sources(tokenizer)
    assert not inputs["attention_mask"].all()  # padded rows among them
    with torch.no_grad():
        expected = model.get_encoder()(**inputs).last_hidden_state
    torch.testing.assert_close(onnx_model.get_encoder()(**inputs).last_hidden_state, expected, atol=1e-4, rtol=0)


def test_onnx_decoding_steps_with_the_cache_give_torchs_logits(trained, onnx_model):
    """Teacher-forced steps: the first through decoder_model.onnx, the next through decoder_with_past_model.onnx."""
    model, tokenizer = trained
    inputs = padded_sources(tokenizer)
    targets = tokenizer(text_target=[t for _, t in PAIRS[:12]], padding=True, return_tensors="pt")["input_ids"]
    hidden = onnx_model.get_encoder()(**inputs)
    config = model.config.get_text_config(decoder=True)
    ours = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    theirs = onnx_model.new_cache()
    tokens = torch.cat([torch.full((targets.shape[0], 1), model.config.decoder_start_token_id), targets], dim=-1)
    for step in range(6):
        with torch.no_grad():
            expected = model(encoder_outputs=hidden, attention_mask=inputs["attention_mask"],
                             decoder_input_ids=tokens[:, step : step + 1], cache=ours, use_cache=True).logits
        logits = onnx_model(hidden, inputs["attention_mask"], tokens[:, step : step + 1], theirs).logits
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
    assert theirs.get_seq_length() == 6


@pytest.mark.parametrize("start", ["bos", "pad"])
def test_onnx_greedy_loop_equals_generate_with_one_beam(trained, onnx_model, monkeypatch, start):
    """From the config's decoder start token: BOS, as ours are trained, or PAD, as Marian's start."""
    model, tokenizer = trained
    inputs = padded_sources(tokenizer)
    start_id = getattr(tokenizer, f"{start}_token_id")
    for config in (model.config, model.generation_config, onnx_model.config):
        monkeypatch.setattr(config, "decoder_start_token_id", start_id)
    with torch.no_grad():
        expected = model.generate(**inputs, num_beams=1)
    assert (expected[:, 0] == start_id).all()
    found = onnx_model.greedy(inputs["input_ids"], inputs["attention_mask"])
    assert torch.equal(found[:, : expected.shape[1]], expected) and (found[:, expected.shape[1] :] == 0).all()


@pytest.mark.parametrize("papers", [True, False])
def test_onnx_greedy_like_generate_ends_no_output_before_its_first_token(trained, onnx_model, monkeypatch, papers):
    """A bias of +30 for EOS, in the torch model and added to each ONNX step's logits: EOS is every step's most
    probable token, and the paper's decoding with one beam, as generate() runs it, ends each output after one token
    (gnmt.py's min_new_tokens=1), not before; a folder without the paper's decoding (`gnmt_alpha`: a converted
    model's) ends each at once, as transformers' greedy search does."""
    model, tokenizer = trained
    biased = type(model)(AutoConfig.for_model(**{**model.config.to_dict(), "add_final_logits_bias": True})).eval()
    biased.load_state_dict(model.state_dict(), strict=False)
    biased.generation_config = copy.deepcopy(model.generation_config)  # the paper's decoding, as the folder's
    if not papers:
        del biased.generation_config.gnmt_alpha
        biased.generation_config.max_new_tokens = 5  # transformers warns at its default limit
        monkeypatch.setattr(onnx_model, "generation_config", biased.generation_config)
    biased.final_logits_bias[0, tokenizer.eos_token_id] = 30.0
    step = type(onnx_model).__call__

    def towards_eos(self, *args, **kwargs):
        output = step(self, *args, **kwargs)
        output.logits[..., tokenizer.eos_token_id] += 30.0
        return output

    monkeypatch.setattr(type(onnx_model), "__call__", towards_eos)
    inputs = padded_sources(tokenizer)
    with torch.no_grad():
        expected = biased.generate(**inputs, num_beams=1)
    assert expected.shape[1] == (3 if papers else 2)  # the start token, one token if the paper's, EOS
    assert torch.equal(onnx_model.greedy(inputs["input_ids"], inputs["attention_mask"]), expected)


def test_the_papers_beam_search_runs_on_onnx_runtime_as_on_torch(trained, onnx_model):
    model, tokenizer = trained
    inputs = padded_sources(tokenizer)
    expected = gnmt_beam_search(model, inputs["input_ids"], inputs["attention_mask"], num_beams=4, alpha=0.6)
    assert torch.equal(gnmt_beam_search(onnx_model, inputs["input_ids"], inputs["attention_mask"], 4, 0.6), expected)
    sources = [source for source, _ in PAIRS[:4]] + [" "]  # a blank source: "", as vaswani-translate gives it
    assert onnx_model.translate(sources) == translate(model, tokenizer, sources)  # the folder's tokenizer, beam, α
    assert onnx_model.translate(["", " "]) == ["", ""]
    by_onnx, by_torch = (sorted(translations(engine, tokenizer, sources, nbest=3)) for engine in (onnx_model, model))
    assert [[text for text, _ in found.hypotheses] for found in by_onnx] == [  # each source's 3 best, in order
        [text for text, _ in found.hypotheses] for found in by_torch]
    assert {len(found.hypotheses) for found in by_onnx} == {3}


def test_onnx_translate_bans_and_stops_where_its_generation_config_says_as_torch(trained, onnx_model, monkeypatch):
    """A generation config's `bad_words_ids` (an OPUS-MT model's <pad>; here the token decoded most) bans the token
    on ONNX Runtime as in the torch model's search: the same translations, none holding it. Its `stop_strings` (that
    token's text) end translations there, as in the torch model's search."""
    model, tokenizer = trained
    sources = [source for source, _ in PAIRS[:12]]
    free = gnmt_beam_search(model, **padded_sources(tokenizer), num_beams=4, alpha=0.6)[:, 1:]
    common = torch.mode(free[free > model.config.eos_token_id]).values.item()  # not PAD, EOS, BOS
    before = onnx_model.translate(sources)
    banning = copy.deepcopy(model.generation_config)
    banning.bad_words_ids = [[common]]
    for decoder in (model, onnx_model):
        monkeypatch.setattr(decoder, "generation_config", banning)
    ids = tokenizer(sources)["input_ids"]
    assert not any(common in hypothesis for hypothesis in onnx_model.decode(ids, 4, 0.6, 1)[0])
    assert before != onnx_model.translate(sources) == translate(model, tokenizer, sources)
    banning.bad_words_ids, banning.stop_strings = None, [tokenizer.decode([common]).strip()]
    assert before != onnx_model.translate(sources) == translate(model, tokenizer, sources)


def test_onnx_translate_refuses_a_lone_string_and_no_beams_in_one_line(onnx_model):
    """A string would be translated a character at a time; 0 beams took the folder's."""
    with pytest.raises(TypeError, match="^sources: a list of strings, got str$"):
        onnx_model.translate("A dog runs.")
    with pytest.raises(ValueError, match="^num_beams must be a whole number of at least 1, got 0$"):
        onnx_model.translate(["A dog runs."], num_beams=0)


@pytest.fixture
def without_eos(trained, onnx_model, monkeypatch):
    """The trained model with a bias of -30 against EOS, and the same added to each ONNX step's logits: no output
    ends before its limit."""
    model, tokenizer = trained
    biased = type(model)(AutoConfig.for_model(**{**model.config.to_dict(), "add_final_logits_bias": True})).eval()
    biased.load_state_dict(model.state_dict(), strict=False)
    biased.generation_config = model.generation_config  # the paper's decoding, as the folder's
    biased.final_logits_bias[0, tokenizer.eos_token_id] = -30.0
    step = type(onnx_model).__call__

    def against_eos(self, *args, **kwargs):
        output = step(self, *args, **kwargs)
        output.logits[..., tokenizer.eos_token_id] -= 30.0
        return output

    monkeypatch.setattr(type(onnx_model), "__call__", against_eos)
    return biased


def test_onnx_greedy_runs_as_long_as_generate_without_eos(trained, onnx_model, without_eos, monkeypatch):
    """No output ends (`without_eos`), and each runs as far as generate(num_beams=1) runs it, the longest source of
    the batch + 50 tokens, or `max_new_tokens`; + 9 where the generation config's `extra_length` says 9."""
    model, tokenizer = trained
    biased = without_eos
    inputs = tokenizer(["A dog.", "dog " * 30], padding=True, return_tensors="pt")
    for limit in ({}, {"max_new_tokens": 7}):
        with torch.no_grad():
            expected = biased.generate(**inputs, num_beams=1, **limit)
        found = onnx_model.greedy(inputs["input_ids"], inputs["attention_mask"], **limit)
        assert torch.equal(found, expected)
        assert found.shape[1] == 1 + limit.get("max_new_tokens", inputs["attention_mask"].sum(-1).max() + 50)
    monkeypatch.setattr(onnx_model, "generation_config", copy.deepcopy(onnx_model.generation_config))
    biased.generation_config = copy.deepcopy(model.generation_config)
    onnx_model.generation_config.extra_length = biased.generation_config.extra_length = 9  # run.py --extra_length 9
    with torch.no_grad():
        expected = biased.generate(**inputs, num_beams=1)
    assert expected.shape[1] == 1 + inputs["attention_mask"].sum(-1).max() + 9
    assert torch.equal(onnx_model.greedy(inputs["input_ids"], inputs["attention_mask"]), expected)


@pytest.mark.parametrize("beams", [1, 4])
def test_onnx_translate_runs_as_long_as_vaswani_translate_without_eos(trained, onnx_model, without_eos, beams):
    """No output ends (`without_eos`), and each runs to its own source's length + 50 tokens, whatever the others
    in its batch, as the paper's search runs it on the torch model (vaswani-translate's), greedy too."""
    _, tokenizer = trained
    sources = ["A dog.", "dog " * 30]
    expected = sorted(translations(without_eos, tokenizer, sources, num_beams=beams))
    assert [found.tokens for found in expected] == [len(ids) + 50 for ids in tokenizer(sources)["input_ids"]]
    assert onnx_model.translate(sources, num_beams=beams) == [found.hypotheses[0][0] for found in expected]


def test_onnx_translate_decodes_batches_within_max_tokens_and_answers_in_order(onnx_model, monkeypatch):
    """Each batch holds at most `max_tokens` source tokens, padding included (a longer source alone); every source is
    decoded once and its translation comes back at its own place (a stand-in search that echoes its sources)."""
    from vaswani_hf.tools import translate as translate_module

    shapes = []

    def echo(model, ids, mask, beams, alpha, **_):
        shapes.append((tuple(ids.shape), int(mask.sum())))
        return torch.cat([torch.full_like(ids[:, :1], BOS), ids], 1), torch.zeros(len(ids))  # after the start token

    monkeypatch.setattr(translate_module, "gnmt_beam_search", echo)
    sources = ["A dog runs.", "", "A small dog likes a book and the big cat.", "A cat.", "dog " * 12, "The book."]
    tokenizer = onnx_model.tokenizer
    lengths = [len(ids) for ids in tokenizer([s for s in sources if s.strip()])["input_ids"]]
    found = onnx_model.translate(sources, max_tokens=20)
    assert found == [tokenizer.decode(tokenizer(s)["input_ids"], skip_special_tokens=True) for s in sources]
    assert len(shapes) > 1 and sum(tokens for _, tokens in shapes) == sum(lengths)
    assert all(rows * width <= 20 or rows == 1 for (rows, width), _ in shapes)


def test_onnx_translate_stops_at_learned_positions_as_torch_and_refuses_a_longer_source(translation_folder, tmp_path):
    """Table 3's learned positions (12 here): each output stops at the last one, as the paper's search stops the
    torch model's (random weights seldom end a sentence sooner), greedy and beam 4; a source of more tokens than
    positions is refused in one line before anything is decoded."""
    from vaswani_hf.exports.to_onnx import export

    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    model = tiny_model(seed=3, vocab_size=len(tokenizer), position_embedding="learned", max_position_embeddings=12,
                       num_layers=1, num_decoder_layers=1)  # a layer a side: the export's time grows with each
    export(model, tokenizer, tmp_path / "onnx")
    engine = OnnxSeq2Seq(tmp_path / "onnx", threads=torch.get_num_threads())
    sources = [source for source, _ in PAIRS[:3]]
    inputs = tokenizer(sources, padding=True, return_tensors="pt")
    assert engine.greedy(inputs["input_ids"], inputs["attention_mask"]).shape[1] == 1 + 12  # the start, 12 positions
    for beams in (1, 4):
        assert engine.translate(sources, num_beams=beams) == translate(model, tokenizer, sources, num_beams=beams)
    with pytest.raises(ValueError, match="has 13 tokens; this model's positions stop at 12"):
        engine.translate(["A dog runs.", " ".join(["dog"] * 12)])


def test_onnx_export_of_a_model_beyond_the_papers_defaults_decodes_as_torch(translation_folder, tmp_path):
    """Every option a converted model or Table 3 may set at once (fairseq's position table with its offset, Marian's
    logits bias, pre-LN, GELU, heads of d_k 4 and d_v 6 < d_model / h, unscaled and untied embeddings, another
    LayerNorm epsilon; 1 encoder and 2 decoder layers): the graphs encode, and greedy and beam 4 decode, as torch."""
    from vaswani_hf.exports.to_onnx import export

    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    model = tiny_model(seed=5, vocab_size=len(tokenizer), position_encoding_layout="halves",
                       position_encoding_frequencies="fairseq", position_offset=2, add_final_logits_bias=True,
                       normalize_before=True, activation_function="gelu", d_k=4, d_v=6, scale_embedding=False,
                       tie_word_embeddings=False, layer_norm_eps=0.1, num_layers=1, num_decoder_layers=2)
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 1.0)
    model.generation_config = GenerationConfig.from_pretrained(translation_folder)  # the paper's decoding, a run's
    export(model, tokenizer, tmp_path / "onnx")
    engine = OnnxSeq2Seq(tmp_path / "onnx", threads=torch.get_num_threads())
    inputs = padded_sources(tokenizer)
    with torch.no_grad():
        expected = model.get_encoder()(**inputs).last_hidden_state
        greedy = model.generate(**inputs, num_beams=1)
    torch.testing.assert_close(engine.get_encoder()(**inputs).last_hidden_state, expected, atol=1e-4, rtol=0)
    assert torch.equal(engine.greedy(inputs["input_ids"], inputs["attention_mask"]), greedy)
    sources = [source for source, _ in PAIRS[:4]]
    assert engine.translate(sources) == translate(model, tokenizer, sources)


def test_onnx_translate_decodes_as_the_folders_generation_config_says(onnx_model, monkeypatch):
    """The folder's beam size, GNMT α and `extra_length`, else the paper's 4, 0.6 and 50; a call's own, one beam
    too."""
    from vaswani_hf.tools import translate as translate_module

    calls = []
    monkeypatch.setattr(translate_module, "gnmt_beam_search", lambda model, ids, mask, beams, alpha, *, extra_length,
                        **_: calls.append((beams, alpha, extra_length)) or (ids, torch.zeros(len(ids))))
    paper = {"num_beams": 3, "gnmt_alpha": 1.2}
    for config, call in ((GenerationConfig(**paper), {}), (GenerationConfig(), {}),
                         (GenerationConfig(**paper, extra_length=300), {}),
                         (GenerationConfig(**paper), {"num_beams": 5, "alpha": 0.0}),
                         (GenerationConfig(**paper), {"num_beams": 1})):
        monkeypatch.setattr(onnx_model, "generation_config", config)
        onnx_model.translate(["A dog runs."], **call)
    assert calls == [(3, 1.2, 50), (4, 0.6, 50), (3, 1.2, 300), (5, 0.0, 50), (1, 1.2, 50)]


# --- Marian -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("options", [
    {},  # the paper's: interleaved sinusoids, tensor2tensor's LayerNorm epsilon
    # what a converted model may set that Marian computes: halves, its output bias, swish, unscaled and untied
    # embeddings, torch's epsilon (Marian's: then the same numbers)
    {"position_encoding_layout": "halves", "add_final_logits_bias": True, "activation_function": "swish",
     "scale_embedding": False, "tie_word_embeddings": False, "layer_norm_eps": 1e-5},
])
def test_transformers_marian_computes_the_marian_export_as_ours_and_decodes_as_generate(trained, tmp_path, options):
    """The export loaded by transformers alone (`AutoModelForSeq2SeqLM`: a MarianMTModel): logits of a padded batch
    as ours (1e-5 of a logit, the epsilon aside), and its generation config's decoding (beam 4, log P / |Y|^0.6;
    greedy) our `generate()`'s tokens with the same settings. LayerNorm gains and biases drawn at random, so that
    each weight's permutation counts."""
    from vaswani_hf.exports.to_marian import export

    _, tokenizer = trained
    model = tiny_model(seed=3, vocab_size=len(tokenizer), max_position_embeddings=40, **options)
    if model.config.add_final_logits_bias:
        with torch.no_grad():
            model.final_logits_bias.normal_(0.0, 1.0)
    model.generation_config = GenerationConfig.from_model_config(model.config)
    set_paper_decoding(model.generation_config, num_beams=4, alpha=0.6)  # as a run saves it
    export(model, tokenizer, tmp_path / "marian")
    marian = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "marian").eval()
    assert type(marian).__name__ == "MarianMTModel" and marian.config.forced_eos_token_id is None  # (Marian's: 0)
    saved = marian.generation_config
    assert (saved.num_beams, saved.length_penalty, saved.early_stopping, saved.max_length) == (4, 0.6, True, 40)
    inputs = padded_sources(tokenizer)
    targets = tokenizer(text_target=[target for _, target in PAIRS[:12]], padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = model(**inputs, decoder_input_ids=targets["input_ids"]).logits
        theirs = marian(**inputs, decoder_input_ids=targets["input_ids"]).logits
        torch.testing.assert_close(theirs, ours, atol=1e-5 if model.config.layer_norm_eps == 1e-5 else 5e-5, rtol=0)
        for beams in (4, 1):
            expected = model.generate(**inputs, gnmt_alpha=None, num_beams=beams, length_penalty=0.6,
                                      early_stopping=True, max_length=40)
            assert torch.equal(marian.generate(**inputs, num_beams=beams), expected)


def test_the_marian_export_loads_with_transformers_alone_and_translates_as_our_beam_search(translation_folder,
                                                                                         trained, tmp_path):
    """`vaswani-export marian` of a run's folder: its tokenizer and model load as transformers' own classes (no code
    of ours), and `generate()` with its generation config gives our `generate()`'s beam 4 translations ranked by
    log P / |Y|^α with the run's α."""
    from transformers import MarianMTModel

    model, tokenizer = trained
    export_main(["marian", str(translation_folder), str(tmp_path / "marian")])
    marian = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "marian").eval()
    their_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "marian")
    assert type(marian) is MarianMTModel and type(their_tokenizer) is type(tokenizer)
    assert not any(path.suffix == ".py" for path in (tmp_path / "marian").iterdir())
    sources = [source for source, _ in PAIRS[:8]]
    with torch.no_grad():
        expected = model.generate(**tokenizer(sources, padding=True, return_tensors="pt"), gnmt_alpha=None,
                                  num_beams=4, length_penalty=model.generation_config.gnmt_alpha, early_stopping=True,
                                  max_length=model.config.max_position_embeddings)
        found = marian.generate(**their_tokenizer(sources, padding=True, return_tensors="pt"))
    assert their_tokenizer.batch_decode(found, skip_special_tokens=True) == tokenizer.batch_decode(
        expected, skip_special_tokens=True)


@pytest.mark.parametrize(("options", "named"), [
    ({"position_embedding": "learned"}, "position_embedding='learned'"),
    ({"normalize_before": True}, "normalize_before=True"),
    ({"position_encoding_frequencies": "fairseq", "position_offset": 2},
     "position_encoding_frequencies='fairseq', position_offset=2"),
    ({"d_k": 4}, "d_k=4, d_v=8 (Marian's heads are d_model / num_heads wide)"),
    ({"d_v": 4}, "d_k=8, d_v=4 (Marian's heads are d_model / num_heads wide)"),
])
def test_a_model_marian_does_not_compute_is_refused_in_one_line(translation_folder, tmp_path, options, named):
    folder = tmp_path / "model"
    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    tiny_model(vocab_size=len(tokenizer), **options).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with pytest.raises(SystemExit) as error:
        export_main(["marian", str(folder), str(tmp_path / "out")])
    assert error.value.code == f"error: MarianMTModel does not compute this model's {named}"
    assert not (tmp_path / "out").exists()
