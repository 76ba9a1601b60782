"""`vaswani-convert`: a converted model computes what its source computes. The sources are random-weight stand-ins
built here in their own format (nothing is downloaded): a MarianMTModel folder with a SentencePiece tokenizer, as
OPUS-MT's are laid out, and fairseq release folders (model.pt with `args`, dictionaries, bpecodes). The references
are transformers' MarianMTModel and FSMT (its port of fairseq's Transformer) with the same weights, and for
fairseq's tokenization its own pipeline: Moses, subword-nmt, the dictionary."""

import argparse
import collections
import io
import json
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from support import CODE_FILES, draw_gains_and_biases, refusal, run_hidden, run_training
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessorList,
    MarianConfig,
    MarianMTModel,
    MarianTokenizer,
    NoBadWordsLogitsProcessor,
    StoppingCriteriaList,
    StopStringCriteria,
)

from training import run_trainer
from training.default_data import generate
from vaswani_hf.exports import convert
from vaswani_hf.gnmt import gnmt_beam_search

SENTENCES = [en for en, _ in generate()["test"][:300]]


def write_marian(folder) -> None:
    """A tiny MarianMTModel in OPUS-MT's layout: a unigram SentencePiece model shared by both sides, vocab.json with
    </s> 0, <unk> 1 and <pad> last (the decoder's start), swish, scaled embeddings, a random output bias, and the
    generation config OPUS-MT models are published with (beam 4, never <pad>). The weights are drawn wide (std 0.3),
    the biases and LayerNorms at random, so that the decoding choices are real ones."""
    import sentencepiece

    folder.mkdir(parents=True)
    pairs = generate()["train"][:3000]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([text for pair in pairs for text in pair]), model_prefix=str(folder / "spm"),
        vocab_size=200, model_type="unigram", character_coverage=1.0, minloglevel=2)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    vocab = ["</s>", "<unk>", *[piece for piece in pieces if piece not in ("<s>", "</s>", "<unk>")], "<pad>"]
    (folder / "vocab.json").write_text(json.dumps({piece: i for i, piece in enumerate(vocab)}), encoding="utf-8")
    MarianTokenizer(*(str(folder / name) for name in ("spm.model", "spm.model", "vocab.json")), source_lang="en",
                    target_lang="de").save_pretrained(folder)
    pad = len(vocab) - 1
    values = {"vocab_size": len(vocab), "d_model": 16, "encoder_layers": 2, "decoder_layers": 3, "encoder_ffn_dim": 24,
              "decoder_ffn_dim": 24, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
              "activation_function": "swish", "scale_embedding": True, "max_position_embeddings": 128,
              "pad_token_id": pad, "decoder_start_token_id": pad, "eos_token_id": 0, "forced_eos_token_id": 0,
              "init_std": 0.3, "dropout": 0.1, "attention_dropout": 0.2, "activation_dropout": 0.15}
    torch.manual_seed(0)
    marian = MarianMTModel(MarianConfig(**values))
    marian.final_logits_bias.normal_()
    draw_gains_and_biases(marian)
    marian.generation_config.update(num_beams=4, max_length=40, bad_words_ids=[[pad]])
    marian.save_pretrained(folder)
    (folder / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n\n# opus-mt-en-de (a stand-in)\n",
                                      encoding="utf-8")


@pytest.fixture(scope="module")
def marian_pair(tmp_path_factory):
    """(source folder, converted folder)."""
    root = tmp_path_factory.mktemp("marian")
    write_marian(root / "source")
    convert.main(["marian", str(root / "source"), str(root / "converted")])
    return root / "source", root / "converted"


def batch(folder, sentences):
    return MarianTokenizer.from_pretrained(folder)(sentences, return_tensors="pt", padding=True)


def test_a_converted_marian_model_gives_marians_logits_and_translations(marian_pair):
    """Logits within 1e-5 over a padded batch; greedy and beam-4 outputs token for token, each model decoding with
    the generation config it was saved with; the config options it needed are named, in the card too, with the
    source's license."""
    from huggingface_hub import ModelCard

    source, converted = marian_pair
    marian = MarianMTModel.from_pretrained(source).eval()
    ours = AutoModelForSeq2SeqLM.from_pretrained(converted).eval()
    assert type(ours).__name__ == "VaswaniForConditionalGeneration"
    config = ours.config
    assert (config.position_encoding_layout, config.activation_function, config.add_final_logits_bias,
            config.decoder_start_token_id) == ("halves", "swish", True, marian.config.pad_token_id)
    assert (config.dropout, config.attention_dropout, config.activation_dropout, config.max_position_embeddings) == (
        0.1, 0.2, 0.15, 128)  # fine-tuned, it trains as the source did
    card = ModelCard.load(converted / "README.md")
    assert card.data.license == "cc-by-4.0" and "`activation_function='swish'`" in card.text
    assert card.data.base_model is None  # a local folder is no Hub model
    inputs = batch(source, SENTENCES[:8])
    labels = batch(source, SENTENCES[8:16])["input_ids"]
    labels = labels.masked_fill(labels == marian.config.pad_token_id, -100)  # Marian's loss counts what is not -100
    with torch.no_grad():
        expected = marian(**inputs, labels=labels)
        found = ours(**inputs, labels=labels)
    torch.testing.assert_close(found.logits, expected.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(found.loss, expected.loss, atol=1e-5, rtol=0)
    inputs = batch(source, SENTENCES[:32])
    for options in ({"num_beams": 1}, {}):  # greedy; the saved config's beam 4
        assert torch.equal(ours.generate(**inputs, **options), marian.generate(**inputs, **options)), options


@pytest.mark.parametrize("option", ["scale_embedding", "tie_word_embeddings"])
def test_a_marian_model_without_scaled_or_tied_embeddings_converts_to_its_logits(marian_pair, tmp_path, option):
    """OPUS-MT's models scale their embeddings and tie the output projection to them; a Marian model that does
    not converts to what it computes."""
    source = marian_pair[0]
    folder = edited_copy(source, tmp_path / "source", **{option: False})
    marian = MarianMTModel.from_pretrained(folder).eval()
    if option == "tie_word_embeddings":
        with torch.no_grad():
            marian.lm_head.weight.normal_(std=0.3)  # its own matrix, drawn as write_marian draws
    marian.save_pretrained(folder)
    convert.main(["marian", str(folder), str(tmp_path / "converted")])
    ours = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "converted").eval()
    assert getattr(ours.config, option) is False
    inputs = batch(source, SENTENCES[:8])
    decoder_inputs = batch(source, SENTENCES[8:16])["input_ids"]
    with torch.no_grad():
        expected = marian(**inputs, decoder_input_ids=decoder_inputs).logits
        found = ours(**inputs, decoder_input_ids=decoder_inputs).logits
    torch.testing.assert_close(found, expected, atol=1e-5, rtol=0)


def test_marians_silu_is_converted_as_swish():
    """transformers' Marian configs may name swish by its other name, SiLU: the same function, not refused."""
    from transformers.activations import ACT2FN

    assert convert.marian_config(MarianConfig(activation_function="silu")).activation_function == "swish"
    x = torch.linspace(-8, 8, 161)
    torch.testing.assert_close(ACT2FN["swish"](x), ACT2FN["silu"](x), atol=0, rtol=0)


def test_the_converted_tokenizer_gives_the_sentencepiece_models_ids_and_text(marian_pair):
    """Against the source's SentencePiece model and vocabulary read directly, not through a tokenizer class: a
    sentence's ids are vocab.json's ids of the model's pieces, then </s>, on both sides; they decode to the text the
    SentencePiece model gives back."""
    import sentencepiece

    source, converted = marian_pair
    ours = AutoTokenizer.from_pretrained(converted)
    vocab = json.loads((source / "vocab.json").read_text(encoding="utf-8"))
    for side, texts in (("source", SENTENCES), ("target", SENTENCES[:50])):
        pieces = sentencepiece.SentencePieceProcessor(model_file=str(source / f"{side}.spm"))
        expected = [[vocab.get(piece, vocab["<unk>"]) for piece in pieces.encode(text, out_type=str)] + [vocab["</s>"]]
                    for text in texts]
        found = ours(SENTENCES)["input_ids"] if side == "source" else ours(text_target=texts)["input_ids"]
        assert found == expected, side
        assert ours.batch_decode(expected, skip_special_tokens=True) == [
            pieces.decode(pieces.encode(text, out_type=str)) for text in texts], side


def test_vaswani_translate_decodes_a_converted_model_as_published(marian_pair, cli):
    """Without --alpha the source's own decoding (beam 4, transformers' length normalization): Marian's translations;
    with --alpha 0.6 the paper's GNMT search with the processors OPUS-MT's generation config asks for: each source's
    translation is the search's of it alone given transformers' own (<pad> banned, EOS forced at its limit)."""
    source, converted = marian_pair
    marian, tokenizer = MarianMTModel.from_pretrained(source).eval(), MarianTokenizer.from_pretrained(source)
    sources = SENTENCES[:12]
    expected = tokenizer.batch_decode(marian.generate(**batch(source, sources)), skip_special_tokens=True)
    result = cli("--model", converted, "--quiet", "--no_fast_cpu", stdin="\n".join(sources) + "\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected
    paper = cli("--model", converted, "--quiet", "--no_fast_cpu", "--alpha", "0.6", stdin="\n".join(sources) + "\n")
    assert paper.returncode == 0, paper.stderr
    ours = AutoModelForSeq2SeqLM.from_pretrained(converted).eval()
    assert paper.stdout.splitlines() == searched_alone(ours, tokenizer, sources, [[ours.config.pad_token_id]])
    unprocessed = gnmt_beam_search(ours, **batch(source, sources), num_beams=4, alpha=0.6)  # runs to its limit
    assert paper.stdout.splitlines() != tokenizer.batch_decode(unprocessed, skip_special_tokens=True)
    # generate() with gnmt_alpha: the same processors, at the published max_length (40, the start token counted).
    eos, pad = ours.config.eos_token_id, ours.config.pad_token_id
    published = LogitsProcessorList([NoBadWordsLogitsProcessor([[pad]], eos_token_id=eos),
                                     ForcedEOSTokenLogitsProcessor(40, eos)])
    assert torch.equal(ours.generate(**batch(source, sources), gnmt_alpha=0.6), gnmt_beam_search(
        ours, **batch(source, sources), num_beams=4, alpha=0.6, max_new_tokens=39, logits_processor=published))


def searched_alone(model, tokenizer, sources: list[str], banned: list[list[int]], stop: list[str] = ()) -> list[str]:
    """Each source's translation by the paper's search (beam 4, α 0.6) of it alone, given transformers' processors
    for what a converted OPUS-MT model's generation config asks: `banned` words, EOS forced at the source's limit
    (its length + 50; transformers' max_length counts the start token); with `stop`, its StopStringCriteria."""
    eos, found = model.config.eos_token_id, []
    criteria = StoppingCriteriaList([StopStringCriteria(tokenizer, stop)]) if stop else None
    for ids in tokenizer(sources)["input_ids"]:
        limit = len(ids) + 50
        processors = LogitsProcessorList([NoBadWordsLogitsProcessor(banned, eos_token_id=eos),
                                          ForcedEOSTokenLogitsProcessor(limit + 1, eos)])
        found += gnmt_beam_search(model, torch.tensor([ids]), num_beams=4, alpha=0.6, max_new_tokens=limit,
                                  logits_processor=processors, stopping_criteria=criteria).tolist()
    return tokenizer.batch_decode(found, skip_special_tokens=True)


def test_vaswani_translate_scores_a_converted_model_as_marian_gives_its_log_p(marian_pair, cli, tmp_path):
    """--score on a converted model: each line MarianMTModel's own log P of the pair (its tokenizer, `text_target`
    for the translation, its labels shifted into decoder inputs), no processor applied (the banned <pad> too)."""
    source, converted = marian_pair
    marian, tokenizer = MarianMTModel.from_pretrained(source).eval(), MarianTokenizer.from_pretrained(source)
    pairs = generate()["test"][:10]
    (tmp_path / "in.txt").write_text("".join(en + "\n" for en, _ in pairs), encoding="utf-8")
    (tmp_path / "de.txt").write_text("".join(de + "\n" for _, de in pairs), encoding="utf-8")
    result = cli("--model", converted, "--quiet", "--input", tmp_path / "in.txt", "--score", tmp_path / "de.txt")
    assert result.returncode == 0, result.stderr
    expected = []
    for en, de in pairs:
        labels = tokenizer(text_target=[de], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            logits = marian(**tokenizer([en], return_tensors="pt"), labels=labels).logits
        expected.append(logits.log_softmax(-1).gather(-1, labels[..., None]).sum().item())
    assert [float(line) for line in result.stdout.splitlines()] == pytest.approx(expected, abs=1e-4)


def test_vaswani_translate_alpha_bans_what_the_generation_config_bans(marian_pair, cli, tmp_path):
    """With --alpha the paper's search still bans the words the generation config bans (OPUS-MT's <pad>; here also
    the token the search picks most): its translations are the search's given transformers' own processors, and
    never hold the token."""
    source, converted = marian_pair
    tokenizer, sources = MarianTokenizer.from_pretrained(source), SENTENCES[:12]
    ours = AutoModelForSeq2SeqLM.from_pretrained(converted).eval()
    free = gnmt_beam_search(ours, **batch(source, sources), num_beams=4, alpha=0.6)
    common = collections.Counter(free[:, 1:].flatten().tolist()).most_common(1)[0][0]
    banned = [[ours.config.pad_token_id], [common]]
    folder = shutil.copytree(converted, tmp_path / "banned")
    published = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    (folder / "generation_config.json").write_text(json.dumps(published | {"bad_words_ids": banned}), encoding="utf-8")
    paper = cli("--model", folder, "--quiet", "--no_fast_cpu", "--alpha", "0.6", stdin="\n".join(sources) + "\n")
    assert paper.returncode == 0, paper.stderr
    assert paper.stdout.splitlines() == searched_alone(ours, tokenizer, sources, banned)
    assert tokenizer.decode([common]) not in paper.stdout
    assert paper.stdout.splitlines() != searched_alone(ours, tokenizer, sources, [[ours.config.pad_token_id]])


def test_vaswani_translate_ends_translations_at_the_generation_configs_stop_strings(marian_pair, cli, tmp_path):
    """A generation config's `stop_strings` (transformers' StopStringCriteria, read with the model's tokenizer):
    `vaswani-translate --alpha` ends each hypothesis where its text ends with one, as the search given that
    criterion does; the CTranslate2 engine, which has no such criterion, is refused in one line."""
    from vaswani_hf.tools.translate import load_engine

    source, converted = marian_pair
    tokenizer, sources = MarianTokenizer.from_pretrained(source), SENTENCES[:12]
    ours, pad = AutoModelForSeq2SeqLM.from_pretrained(converted).eval(), [[0]]
    free = searched_alone(ours, tokenizer, sources, pad)
    word = collections.Counter(w for line in free for w in line.split()[1:-1]).most_common(1)[0][0]  # within lines
    folder = shutil.copytree(converted, tmp_path / "stopped")
    published = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    (folder / "generation_config.json").write_text(json.dumps(published | {"stop_strings": [word]}), encoding="utf-8")
    paper = cli("--model", folder, "--quiet", "--no_fast_cpu", "--alpha", "0.6", stdin="\n".join(sources) + "\n")
    assert paper.returncode == 0, paper.stderr
    assert paper.stdout.splitlines() == searched_alone(ours, tokenizer, sources, pad, stop=[word]) != free
    with pytest.raises(SystemExit, match=r"^error: cannot load a model from .*: --engine ctranslate2 does not "
                       rf"apply the generation config's stop_strings=\['{word}'\]: decode with --engine torch$"):
        load_engine(str(folder), "ctranslate2")


def test_a_converted_model_fine_tunes_with_the_decoding_it_was_published_with(marian_pair, tmp_path):
    """run_trainer.py --model_name_or_path CONVERTED: two Adam steps of 1e-9 leave the weights within 1e-6 of the
    conversion's; the folder keeps OPUS-MT's generation config (transformers' beam search, never <pad>, its length
    penalty, no gnmt_alpha) with --generation_num_beams' beams, and its SentencePiece tokenizer; the test set is
    decoded that way, and the card says so."""
    from safetensors.torch import load_file

    from training import run_trainer

    converted = shutil.copytree(marian_pair[1], tmp_path / "converted")
    published = json.loads((converted / "generation_config.json").read_bytes()) | {"length_penalty": 0.8}
    (converted / "generation_config.json").write_text(json.dumps(published), encoding="utf-8")
    files = []
    for split, rows in generate().items():
        files += [f"--{split}_file", str(tmp_path / f"{split}.jsonl")]
        lines = (json.dumps({"en": en, "de": de}) + "\n" for en, de in rows[:40 if split == "train" else 4])
        (tmp_path / f"{split}.jsonl").write_text("".join(lines), encoding="utf-8")
    output = tmp_path / "tuned"
    run_trainer.main([*files, "--model_name_or_path", str(converted), "--output_dir", str(output), "--max_steps", "2",
                      "--learning_rate", "1e-9", "--per_device_train_batch_size", "8", "--disable_tqdm", "true",
                      "--generation_num_beams", "2", "--eval_steps", "2"])  # validated as it decodes
    start, tuned = (load_file(folder / "model.safetensors") for folder in (converted, output))
    for name in start:
        torch.testing.assert_close(tuned[name], start[name], atol=1e-6, rtol=0)
    kept = json.loads((output / "generation_config.json").read_text(encoding="utf-8"))
    assert "gnmt_alpha" not in kept and kept["num_beams"] == 2
    assert (kept["bad_words_ids"], kept["length_penalty"]) == (published["bad_words_ids"], 0.8)
    assert (output / "source.spm").read_bytes() == (converted / "source.spm").read_bytes()
    card = " ".join((output / "README.md").read_text(encoding="utf-8").split())
    assert ("decodes as `generation_config.json` asks, as the model it was fine-tuned from was published: "
            "transformers' beam search with 2 beams, hypotheses ranked by log P / |Y|^0.8 (not the paper's GNMT "
            "penalty)") in card
    assert "Decoded with transformers' beam search of 2 beams (log P / |Y|^0.8), scored" in card


def test_run_py_fine_tunes_a_converted_model_with_its_own_tokenizer_on_each_side_and_its_published_decoding(
        marian_pair, tmp_path):
    """run.py --model_name_or_path CONVERTED, whose target side has a SentencePiece model of its own: the token cache
    holds the tokenizer's source ids and its target ids (`text_target`, not the source model's); two Adam steps at a
    peak of about 1e-7 leave the weights within 1e-6 of the conversion's; the folder and its checkpoints keep its
    SentencePiece files and OPUS-MT's generation config with --num_beams' beams, validated, tested and described so;
    resumed from its first checkpoint it ends with the same weights; the paper's α is refused for it in one line."""
    import datasets
    import sentencepiece
    from safetensors.torch import load_file

    from training.batching import encode
    from training.run import check_output_dir

    converted = shutil.copytree(marian_pair[1], tmp_path / "converted")
    published = json.loads((converted / "generation_config.json").read_bytes()) | {"length_penalty": 0.8}
    (converted / "generation_config.json").write_text(json.dumps(published), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(  # German pieces of another segmentation (unknown ones: <unk>)
        sentence_iterator=iter([de for _, de in generate()["train"][:2000]]), model_prefix=str(tmp_path / "de"),
        vocab_size=120, model_type="bpe", minloglevel=2)
    shutil.copy(tmp_path / "de.model", converted / "target.spm")
    files = []
    for split, rows in generate().items():
        files += [f"--{split}_file", tmp_path / f"{split}.jsonl"]
        lines = (json.dumps({"en": en, "de": de}) + "\n" for en, de in rows[:40 if split == "train" else 4])
        (tmp_path / f"{split}.jsonl").write_text("".join(lines), encoding="utf-8")
    flags = [*files, "--model_name_or_path", converted, "--max_steps", "2", "--save_steps", "1",
             "--average_checkpoints", "2", "--max_tokens", "400", "--tokens_per_step", "400", "--warmup_steps", "4",
             "--lr_scale", "1e-6", "--num_beams", "2", "--eval_steps", "2", "--eval_max_sentences", "4"]
    output, resumed = tmp_path / "tuned", tmp_path / "resumed"
    run_training(*flags, "--output_dir", output)

    tokenizer, pairs = AutoTokenizer.from_pretrained(converted), generate()["train"][:40]
    cached = datasets.Dataset.from_file(str(output / "tokens" / "tokens.arrow"))
    assert cached["source_ids"] == tokenizer([en for en, _ in pairs])["input_ids"]
    assert cached["target_ids"] == tokenizer(text_target=[de for _, de in pairs])["input_ids"]
    assert cached["target_ids"] != tokenizer([de for _, de in pairs])["input_ids"]  # the sides' models differ
    start, tuned = (load_file(folder / "model.safetensors") for folder in (converted, output))
    for name in start:
        torch.testing.assert_close(tuned[name], start[name], atol=1e-6, rtol=0)
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert (output / name).read_bytes() == (converted / name).read_bytes()
    kept = json.loads((output / "generation_config.json").read_text(encoding="utf-8"))
    assert "gnmt_alpha" not in kept and kept["num_beams"] == 2
    assert (kept["bad_words_ids"], kept["length_penalty"]) == (published["bad_words_ids"], 0.8)
    metrics = json.loads((output / "metrics.json").read_text(encoding="utf-8"))
    assert "bleu" in metrics["validation"] and "bleu" in metrics["test"]
    card = " ".join((output / "README.md").read_text(encoding="utf-8").split())
    assert ("decodes as `generation_config.json` asks, as the model it was fine-tuned from was published: "
            "transformers' beam search with 2 beams, hypotheses ranked by log P / |Y|^0.8") in card
    assert "length_penalty_alpha=" not in card  # no α deviation: it decodes as published
    overwrite = SimpleNamespace(output_dir=str(output), resume_from_checkpoint=None, overwrite_output_dir=True)
    assert check_output_dir(output, overwrite, {}, print) is None  # all of it a run's: --overwrite_output_dir takes it
    assert encode(tokenizer, pairs[:4]) == (tokenizer([en for en, _ in pairs[:4]])["input_ids"],  # validation's
                                            tokenizer(text_target=[de for _, de in pairs[:4]])["input_ids"])

    shutil.copytree(output, resumed)
    run_training(*flags, "--output_dir", resumed, "--resume_from_checkpoint", resumed / "checkpoint-1")
    assert load_file(resumed / "model.safetensors").keys() == tuned.keys()
    for name, weight in load_file(resumed / "model.safetensors").items():
        assert torch.equal(weight, tuned[name]), name
    for checkpoint in (output / "checkpoint-1", resumed / "checkpoint-2"):  # a model folder that decodes as the run's
        assert json.loads((checkpoint / "generation_config.json").read_text(encoding="utf-8")) == kept
    runs = {"run.py": lambda *given: run_training(*flags, "--output_dir", tmp_path / "unused", *given),
            "run_trainer.py": lambda *given: run_trainer.parse_arguments(["--model_name_or_path", str(converted),
                                                                           *given])}
    for run, search_flags in (("run.py", ["--alpha_candidates", "0.6", "1.0"]), ("run.py", ["--extra_length", "300"]),
                              ("run_trainer.py", ["--length_penalty_alpha", "0.3"])):
        with pytest.raises(SystemExit) as stop:  # before any work
            runs[run](*search_flags)
        assert stop.value.code == (f"error: {search_flags[0]}: {converted} decodes as it was published (its "
                                   "generation_config.json), not with the paper's search that the flag sets: leave "
                                   "the flag out")


def test_vaswani_translates_ctranslate2_engine_takes_a_converted_model_greedily_as_the_torch_engine(
        marian_pair, tmp_path, monkeypatch):
    """A converted Marian model's tokenizer is its SentencePiece files and vocabulary, not tokenizer.json, which the
    engine's cache key read (`--engine ctranslate2` failed on every converted model); those files key the export."""
    from vaswani_hf.tools.ctranslate2_engine import cached_export
    from vaswani_hf.tools.translate import load_engine, translate

    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    _, converted = marian_pair
    sources = SENTENCES[:8]
    (ct2, tokenizer), (ours, _) = load_engine(str(converted), "ctranslate2"), load_engine(str(converted), fast=False)
    assert translate(ct2, tokenizer, sources, num_beams=1, alpha=0.6) == translate(  # each limited by its source
        ours, tokenizer, sources, num_beams=1, alpha=0.6)
    edited = Path(shutil.copytree(converted, tmp_path / "edited"))
    with open(edited / "vocab.json", "a", encoding="utf-8") as file:
        file.write("\n")
    assert cached_export(str(edited), "float32") != cached_export(str(converted), "float32")


@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_ctranslate2_engine_bans_what_the_generation_config_bans_and_refuses_what_it_cannot_apply(
        marian_pair, tmp_path, monkeypatch, cli, num_beams):
    """`bad_words_ids` (OPUS-MT's <pad>; here also the token decoded most) is CTranslate2's suppressed sequences: the
    token never appears, and greedy decoding gives the torch engine's ids (each limited by its source), which bans it
    as transformers does. A logits processor CTranslate2 has not (a penalty on the source's tokens) is refused in one
    line before an export is made, unless the engine is to score alone."""
    from vaswani_hf.tools.translate import load_engine

    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    source, converted = marian_pair
    ids = MarianTokenizer.from_pretrained(source)(SENTENCES[:8])["input_ids"]
    free, _ = load_engine(str(converted), "ctranslate2")[0].decode(ids, num_beams, 0.6, 1)
    common = collections.Counter(token for hypothesis in free for token in hypothesis[:-1]).most_common(1)[0][0]
    published = json.loads((converted / "generation_config.json").read_text(encoding="utf-8"))
    folder = shutil.copytree(converted, tmp_path / "banned")
    (folder / "generation_config.json").write_text(json.dumps(published | {
        "bad_words_ids": [*published["bad_words_ids"], [common]]}), encoding="utf-8")
    banned, _ = load_engine(str(folder), "ctranslate2")[0].decode(ids, num_beams, 0.6, 1)
    assert not any(common in hypothesis for hypothesis in banned)
    if num_beams == 1:
        assert banned == load_engine(str(folder), fast=False)[0].decode(ids, 1, 0.6, 1)[0]
    penalized = shutil.copytree(converted, tmp_path / "penalized")
    (penalized / "generation_config.json").write_text(json.dumps(published | {"encoder_repetition_penalty": 1.2}),
                                                      encoding="utf-8")
    with open(penalized / "vocab.json", "a", encoding="utf-8") as file:  # an export of its own (cached_export's key)
        file.write("\n")
    exports = sorted((tmp_path / "cache").rglob("*"))
    with pytest.raises(SystemExit, match=r"^error: cannot load a model from .*: --engine ctranslate2 does not "
                       r"apply the generation config's encoder_repetition_penalty=1.2: decode with --engine torch$"):
        load_engine(str(penalized), "ctranslate2")
    assert sorted((tmp_path / "cache").rglob("*")) == exports
    if num_beams == 1:  # to score translations alone, no processor applies: the engine is not refused
        targets = load_engine(str(penalized), fast=False)[0].decode(ids, 1, 0.6, 1)[0]
        scored = load_engine(str(penalized), "ctranslate2", scoring=True)[0].score(ids, targets)
        assert scored == pytest.approx(load_engine(str(penalized), fast=False)[0].score(ids, targets), abs=1e-4)
        for side, name in ((0, "in.txt"), (1, "de.txt")):
            (tmp_path / name).write_text("".join(pair[side] + "\n" for pair in generate()["test"][:8]),
                                         encoding="utf-8")
        result = cli("--model", penalized, "--engine", "ctranslate2", "--input", tmp_path / "in.txt", "--score",
                     tmp_path / "de.txt", "--quiet")
        assert result.returncode == 0 and len(result.stdout.splitlines()) == 8, result.stderr


def test_a_converted_model_loads_without_the_package_and_exports(marian_pair, tmp_path):
    """Remote code in a fresh Python without vaswani_hf decodes as the package does; CTranslate2's greedy decoding of
    the export (its swish and output bias included) is ours token for token."""
    import ctranslate2

    from vaswani_hf.tools import export

    source, converted = marian_pair
    ours = AutoModelForSeq2SeqLM.from_pretrained(converted).eval()
    inputs = batch(source, SENTENCES[:8])
    expected = ours.generate(**inputs, num_beams=1).tolist()
    script = """
        import json, sys
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
        folder, sentences = sys.argv[1], json.loads(sys.argv[2])
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
        inputs = tokenizer(sentences, return_tensors="pt", padding=True)
        print(json.dumps(model.generate(**inputs, num_beams=1).tolist()))
    """
    assert json.loads(run_hidden(script, converted, json.dumps(SENTENCES[:8]))) == expected
    export.main(["ctranslate2", str(converted), str(tmp_path / "ct2")])
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=torch.get_num_threads())
    pairs = list(zip(SENTENCES[:8], SENTENCES[8:16], strict=True))
    sources = [tokenizer.convert_ids_to_tokens(tokenizer(source)["input_ids"]) for source, _ in pairs]
    targets = [tokenizer.convert_ids_to_tokens(tokenizer(text_target=target)["input_ids"])[:-1]  # CTranslate2 adds
               for _, target in pairs]                                                            # the </s> itself
    for (source, target), result in zip(pairs, translator.score_batch(sources, targets), strict=True):
        inputs = tokenizer(source, text_target=target, return_tensors="pt")
        with torch.no_grad():
            log_probs = ours(**inputs).logits.log_softmax(-1)[0].gather(-1, inputs["labels"][0, :, None])[:, 0]
        torch.testing.assert_close(torch.tensor(result.log_probs), log_probs, atol=1e-4, rtol=0)


def test_a_converted_marian_model_exports_back_to_its_own_weights_and_decoding(marian_pair, tmp_path):
    """`vaswani-convert marian`, then `vaswani-export marian`: the source's every weight, exactly, its generation
    config as it was published, and its SentencePiece tokenizer's ids."""
    from vaswani_hf.tools import export

    source, converted = marian_pair
    export.main(["marian", str(converted), str(tmp_path / "back")])
    original, back = (MarianMTModel.from_pretrained(folder) for folder in (source, tmp_path / "back"))
    weights = back.state_dict()
    assert original.state_dict().keys() == weights.keys()
    assert all(torch.equal(tensor, weights[name]) for name, tensor in original.state_dict().items())
    unread = {"transformers_version": None, "_from_model_config": None}  # bookkeeping, not decoding
    published, exported = ({**model.generation_config.to_diff_dict(), **unread} for model in (original, back))
    assert exported == published
    assert batch(tmp_path / "back", SENTENCES[:4])["input_ids"].tolist() == batch(source, SENTENCES[:4])[
        "input_ids"].tolist()


def test_a_marian_export_of_ours_converts_back_to_its_logits_with_its_tokenizer(translation_folder, tmp_path):
    """`vaswani-export marian`, then `vaswani-convert marian`: the export's tokenizer is tokenizers' JSON, not
    MarianTokenizer's SentencePiece, and converts as it is; the converted model computes the export's logits
    (Marian's layout, its LayerNorm epsilon) and decodes as it was published (its beam and length penalty)."""
    from vaswani_hf.tools import export

    export.main(["marian", str(translation_folder), str(tmp_path / "marian")])
    convert.main(["marian", str(tmp_path / "marian"), str(tmp_path / "back")])
    marian = MarianMTModel.from_pretrained(tmp_path / "marian").eval()
    back = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "back").eval()
    tokenizers = [AutoTokenizer.from_pretrained(folder) for folder in (translation_folder, tmp_path / "back")]
    inputs = [tokenizer(SENTENCES[:4], return_tensors="pt", padding=True) for tokenizer in tokenizers]
    assert inputs[0]["input_ids"].tolist() == inputs[1]["input_ids"].tolist()
    targets = inputs[0]["input_ids"][:, :5]
    with torch.no_grad():
        expected, found = (model(**inputs[0], decoder_input_ids=targets).logits for model in (marian, back))
    torch.testing.assert_close(found, expected, atol=1e-5, rtol=0)
    assert back.generation_config.length_penalty == marian.generation_config.length_penalty
    assert torch.equal(back.generate(**inputs[0]), marian.generate(**inputs[0]))


def edited_copy(source, folder, **config):
    """A copy of the Marian folder `source` with entries of its config.json replaced."""
    shutil.copytree(source, folder)
    values = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**values, **config}), encoding="utf-8")
    return folder


def test_what_cannot_be_converted_is_one_line_before_anything_is_written(marian_pair, tmp_path, capfd):
    source, converted = marian_pair
    out = tmp_path / "out"
    cases = {
        "exists: give a folder that does not": (source, converted),
        f"{converted / 'config.json' / 'out'}: {converted / 'config.json'} is a file": (source,
                                                                                  converted / "config.json" / "out"),
        "no config.json": (tmp_path, out),  # an empty folder
        "missing is not a model folder": (tmp_path / "missing", out),  # a path, not a Hub id
        "the output folder is blank: give a folder": (source, ""),  # not the current folder
        "the model is blank: give its folder or Hub id": (" ", out),
        "holds a 'vaswani' model, not a Marian one": (converted, out),
        "separate source and target vocabularies": (edited_copy(source, tmp_path / "separate",
                                                                share_encoder_decoder_embeddings=False), out),
        "encoder_ffn_dim != decoder_ffn_dim": (edited_copy(source, tmp_path / "ffn", decoder_ffn_dim=32), out),
        "encoder_attention_heads != decoder_attention_heads": (edited_copy(source, tmp_path / "heads",
                                                                           decoder_attention_heads=2), out),
        "activation_function='tanh'": (edited_copy(source, tmp_path / "tanh", activation_function="tanh"), out),
        "normalize_before=True": (edited_copy(source, tmp_path / "pre-ln", normalize_before=True), out),
    }
    for expected, (model, output) in cases.items():
        message = refusal(capfd, convert.main, "marian", model, output)
        assert expected in message, message
        assert not out.exists() and not list(tmp_path.glob(".out.*"))
    damaged = edited_copy(source, tmp_path / "damaged")
    (damaged / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes()[:5000])
    assert "cannot convert" in refusal(capfd, convert.main, "marian", damaged, out) and not out.exists()
    mismatch = edited_copy(source, tmp_path / "mismatch")
    vocab = json.loads((mismatch / "vocab.json").read_text(encoding="utf-8"))
    (mismatch / "vocab.json").write_text(json.dumps(dict(list(vocab.items())[:-3])),
                                         encoding="utf-8")  # another vocabulary's
    message = refusal(capfd, convert.main, "marian", mismatch, out)
    assert "tokens but its embedding 200 rows" in message and not out.exists()
    untokenized = edited_copy(source, tmp_path / "untokenized")  # transformers' MarianTokenizer: a TypeError
    (untokenized / "source.spm").unlink()
    message = refusal(capfd, convert.main, "marian", untokenized, out)
    assert "its tokenizer is incomplete (no source.spm there, nor a tokenizer.json)" in message and not out.exists()


@pytest.mark.parametrize(("source", "missing"), [("marian", "sentencepiece"), ("marian", "sacremoses"),
                                                  ("fairseq", "sacremoses")])
def test_a_missing_tokenizer_package_is_named_with_the_command_that_installs_it(tmp_path, capfd, monkeypatch, source,
                                                                                missing):
    """The `convert` extra's packages (Marian's and fairseq's tokenizers), each made unimportable in this process
    (None in sys.modules): one line naming it, before the model is looked for (here it does not exist)."""
    monkeypatch.setitem(sys.modules, missing, None)
    message = refusal(capfd, convert.main, source, tmp_path / "no-model", tmp_path / "out")
    assert message == (f"error: vaswani-convert {source} needs {missing}: pip install {missing} "
                       '(or pip install "vaswani_hf[convert]")')
    assert not (tmp_path / "out").exists()


def test_the_converted_folder_publishes_and_pipelines_as_one_of_ours(marian_pair, tmp_path):
    """vaswani-push sends the weights, config, generation config, code, card and Marian's tokenizer files, and those
    files alone translate as the folder does; the folder's translation pipeline decodes as published."""
    from transformers import pipeline

    from vaswani_hf.tools.hub import published_files

    source, converted = marian_pair
    files = set(published_files(converted))
    assert files == CODE_FILES | {"model.safetensors", "config.json", "generation_config.json", "README.md",
                                  "pipeline_vaswani.py", "tokenizer_config.json", "source.spm", "target.spm",
                                  "vocab.json"}, files
    (tmp_path / "published").mkdir()
    for name in files:
        shutil.copy(converted / name, tmp_path / "published" / name)
    marian, tokenizer = MarianMTModel.from_pretrained(source).eval(), MarianTokenizer.from_pretrained(source)
    expected = tokenizer.batch_decode(marian.generate(**batch(source, SENTENCES[:6])), skip_special_tokens=True)
    translate = pipeline("translation", model=str(tmp_path / "published"), trust_remote_code=True)
    assert [row["translation_text"] for row in translate(SENTENCES[:6], batch_size=6)] == expected


# fairseq: a release folder as fairseq writes it (model.pt, dict.en.txt, dict.de.txt, bpecodes), from a random FSMT
# model (transformers' port of fairseq's Transformer), which is the reference.

MOSES_SENTENCES = ['He said: "A well-known man\'s dog -- isn\'t it red?"', "Ein Hund & eine Katze (groß) für 5,50 €.",
                   "It's 20% cheaper - really!", "«Nein», sagte sie."]


def moses(text: str, lang: str = "en") -> str:
    """fairseq's preprocessing of WMT text, as Moses' scripts did it: punctuation normalized, then tokenized."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalized = MosesPunctNormalizer(lang=lang).normalize(text)
    return MosesTokenizer(lang=lang).tokenize(normalized, aggressive_dash_splits=True, return_str=True, escape=True)


def write_fairseq(folder, fused: bool, old_names: bool, share_all: bool = True, activation: str = "relu",
                  pre_ln: bool = False, scale_embedding: bool = True):
    """The folder, and the FSMT model its weights come from. `fused`: attention projections stored as one
    `in_proj_weight` (fairseq before 2020); `old_names`: LayerNorms as `layer_norms.N` and no stored output
    projection (shared with the target embedding), as the 2018 releases of Ott et al. hold them; `share_all`: the
    source embedding is that matrix too (--share_all_embeddings); `scale_embedding` False: --no-scale-embedding.
    `pre_ln`: --encoder-normalize-before and --decoder-normalize-before, from M2M100 (fairseq's pre-LN Transformer,
    the LayerNorm after each stack included) in place of FSMT."""
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe
    from transformers import FSMTConfig, FSMTForConditionalGeneration, M2M100Config, M2M100ForConditionalGeneration

    folder.mkdir(parents=True)
    pairs = generate()["train"][:2000]
    text = "".join(moses(en, "en") + "\n" + moses(de, "de") + "\n" for en, de in pairs)
    with open(folder / "bpecodes", "w", encoding="utf-8") as codes:
        learn_bpe(io.StringIO(text), codes, num_symbols=120)
    with open(folder / "bpecodes", encoding="utf-8") as codes:
        bpe = BPE(codes)
    counts = collections.Counter(word for line in text.splitlines() for word in bpe.process_line(line).split())
    dictionary = "".join(f"{word} {count}\n" for word, count in counts.most_common())
    for lang in ("en", "de"):  # one joint dictionary, under both names
        (folder / f"dict.{lang}.txt").write_text(dictionary, encoding="utf-8")
    size = len(counts) + 4
    torch.manual_seed(0)
    sizes = {"d_model": 16, "encoder_layers": 2, "decoder_layers": 3, "encoder_ffn_dim": 24, "decoder_ffn_dim": 24,
             "encoder_attention_heads": 4, "decoder_attention_heads": 4, "max_position_embeddings": 128,
             "init_std": 0.3, "activation_function": activation, "scale_embedding": scale_embedding}
    if pre_ln:  # M2M100 shares its embeddings among all three
        assert share_all
        fsmt = M2M100ForConditionalGeneration(M2M100Config(
            vocab_size=size, **sizes, dropout=0.0, bos_token_id=0, pad_token_id=1, eos_token_id=2,
            decoder_start_token_id=2)).eval()
    else:  # tied, FSMT shares one matrix among all three
        fsmt = FSMTForConditionalGeneration(FSMTConfig(
            langs=["en", "de"], src_vocab_size=size, tgt_vocab_size=size, **sizes, forced_eos_token_id=None,
            tie_word_embeddings=share_all)).eval()
    if not share_all:  # --share_decoder_input_output_embed alone
        with torch.no_grad():
            fsmt.model.decoder.output_projection.weight.copy_(fsmt.model.decoder.embed_tokens.weight)
    encoder, decoder = fsmt.model.encoder.embed_tokens.weight, fsmt.model.decoder.embed_tokens.weight
    assert torch.equal(encoder, decoder) == share_all
    draw_gains_and_biases(fsmt)
    names = {"lm_head.weight": "decoder.output_projection.weight"}  # M2M100's; it keeps `shared` besides
    weights = {names.get(name, name.removeprefix("model.")): tensor.clone()
               for name, tensor in fsmt.state_dict().items()
               if ".embed_positions." not in name and name != "model.shared.weight"}
    weights |= {"encoder.version": torch.tensor([3.0]), "decoder.version": torch.tensor([3.0]),
                "encoder.embed_positions._float_tensor": torch.tensor([]),
                "decoder.embed_positions._float_tensor": torch.tensor([])}
    if fused:
        for name in [name for name in weights if name.endswith((".q_proj.weight", ".q_proj.bias"))]:
            kind = name.rsplit(".", 1)[1]
            parts = [weights.pop(name.replace(".q_proj.", f".{part}_proj.")) for part in ("q", "k", "v")]
            weights[name.replace(f"q_proj.{kind}", f"in_proj_{kind}")] = torch.cat(parts)
    if old_names:
        del weights["decoder.output_projection.weight"]
        for stack, norms in (("encoder", ["self_attn", "final"]), ("decoder", ["self_attn", "encoder_attn", "final"])):
            for name in [name for name in weights if name.startswith(stack) and "_layer_norm." in name]:
                index = norms.index(name.split(".")[3].removesuffix("_layer_norm"))
                weights[re.sub(r"\.\w+_layer_norm\.", f".layer_norms.{index}.", name)] = weights.pop(name)
    args = argparse.Namespace(
        arch="transformer_vaswani_wmt_en_de_big", task="translation", source_lang="en", target_lang="de",
        encoder_embed_dim=16, decoder_embed_dim=16, encoder_ffn_embed_dim=24, decoder_ffn_embed_dim=24,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_layers=2, decoder_layers=3,
        encoder_normalize_before=pre_ln, decoder_normalize_before=pre_ln, encoder_learned_pos=False,
        decoder_learned_pos=False, share_all_embeddings=share_all, share_decoder_input_output_embed=True,
        activation_fn=activation, dropout=0.3, attention_dropout=0.1, relu_dropout=0.2, max_source_positions=128,
        max_target_positions=128,
        adaptive_softmax_cutoff=None, label_smoothing=0.1, lr=[0.001], optimizer="adam",
        no_scale_embedding=not scale_embedding)
    torch.save({"args": args, "model": weights, "extra_state": {"epoch": 7, "val_loss": 3.91},
                "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                       "optimizer_name": "FairseqAdam", "num_updates": 1000}],
                "last_optimizer_state": None}, folder / "model.pt")
    return fsmt


def fairseq_ids(folder, sentences: list[str]) -> list[list[int]]:
    """fairseq's own pipeline: Moses, subword-nmt's BPE (the package fairseq calls), the dictionary, then </s>."""
    from subword_nmt.apply_bpe import BPE

    with open(folder / "bpecodes", encoding="utf-8") as codes:
        bpe = BPE(codes)
    lines = (folder / "dict.en.txt").read_text(encoding="utf-8").splitlines()
    index = {word: i for i, word in enumerate(["<s>", "<pad>", "</s>", "<unk>", *(l.split()[0] for l in lines)])}
    return [[index.get(word, 3) for word in bpe.process_line(moses(text)).split()] + [2] for text in sentences]


@pytest.mark.parametrize("layout", [
    {"fused": True, "old_names": True}, {"fused": False, "old_names": False},
    {"fused": True, "old_names": True, "share_all": False, "activation": "gelu"},
    {"fused": True, "old_names": False, "pre_ln": True, "scale_embedding": False},
], ids=["2018 layout", "split layout", "2018 layout, own source embedding, GELU", "pre-LN, unscaled embeddings"])
def test_a_converted_fairseq_checkpoint_gives_fairseqs_logits_translations_and_ids(tmp_path, layout):
    """Against FSMT (M2M100 for pre-LN) with the same weights: logits within 1e-5 over a padded batch, greedy and
    beam-4 outputs token for token; the tokenizer's ids are fairseq's pipeline's (Moses + subword-nmt + dictionary)
    on 300 sentences; the dropouts and length limit of its training arguments."""
    fsmt = write_fairseq(tmp_path / "release", **layout)
    convert.main(["fairseq", str(tmp_path / "release"), str(tmp_path / "converted")])
    ours = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "converted").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "converted")
    sentences = SENTENCES + MOSES_SENTENCES
    assert tokenizer(sentences)["input_ids"] == fairseq_ids(tmp_path / "release", sentences)
    config = ours.config
    assert (config.position_encoding_frequencies, config.position_offset) == ("fairseq", 2)
    assert (config.dropout, config.attention_dropout, config.activation_dropout, config.max_position_embeddings) == (
        0.3, 0.1, 0.2, 128)
    assert_computes_as_fsmt(ours, fsmt, tokenizer, sentences, {"length_penalty": 0.6, "early_stopping": True})


def assert_computes_as_fsmt(ours, fsmt, tokenizer, sentences: list[str], beam: dict):
    """Logits within 1e-5 of FSMT's over a padded batch, and the same outputs of greedy and beam-4 search (with
    `beam`'s settings), token for token."""
    inputs = tokenizer(sentences[:8], return_tensors="pt", padding=True)
    targets = tokenizer(sentences[8:16], return_tensors="pt", padding=True)["input_ids"][:, :5]
    decoder_inputs = torch.cat([torch.full((8, 1), 2), targets[:, :-1]], dim=1)  # </s> starts, as in fairseq
    with torch.no_grad():  # FSMT, given a cache, would decode the last of the decoder inputs alone
        expected = fsmt(**inputs, decoder_input_ids=decoder_inputs, use_cache=False).logits
        found = ours(**inputs, labels=targets).logits  # shifted from the config's start token, as fine-tuning does
    torch.testing.assert_close(found, expected, atol=1e-5, rtol=0)
    inputs = tokenizer(SENTENCES[:24], return_tensors="pt", padding=True)
    for options in ({"num_beams": 1}, {"num_beams": 4, **beam}):
        assert torch.equal(ours.generate(**inputs, max_new_tokens=30, **options),
                           fsmt.generate(**inputs, max_new_tokens=30, **options)), options


@pytest.fixture(scope="module")
def fairseq_release(tmp_path_factory):
    """(release folder, the FSMT model its weights come from)."""
    folder = tmp_path_factory.mktemp("fairseq") / "release"
    return folder, write_fairseq(folder, fused=True, old_names=True)


def edited_release(release, folder, *, remove=(), checkpoint=None, dictionary=None):
    """A copy of the release folder without the files `remove`, with `checkpoint(state)` saved as model.pt, or
    dict.de.txt replaced by `dictionary(text)`."""
    shutil.copytree(release, folder)
    for name in remove:
        (folder / name).unlink()
    if checkpoint:
        with torch.serialization.safe_globals([argparse.Namespace]):
            state = torch.load(release / "model.pt", weights_only=True, map_location="cpu")
        torch.save(checkpoint(state), folder / "model.pt")
    if dictionary:
        (folder / "dict.de.txt").write_text(dictionary((folder / "dict.de.txt").read_text(encoding="utf-8")),
                                            encoding="utf-8")
    return folder


def test_fairseqs_meters_in_a_checkpoint_are_read_without_fairseq(fairseq_release, tmp_path, monkeypatch):
    """fairseq's trainer pickles its meters (fairseq.meters.AverageMeter, ...) into extra_state; such a checkpoint
    converts where fairseq is not installed, its meters received by stand-ins that run no code of theirs."""
    import types

    module = types.ModuleType("fairseq.meters")
    for name in ("AverageMeter", "TimeMeter"):
        setattr(module, name, type(name, (), {"__module__": "fairseq.meters"}))
    meters = collections.OrderedDict(train_loss=module.AverageMeter(), wps=module.TimeMeter())
    meters["train_loss"].__dict__.update(val=3.9, avg=4.2, sum=420.0, count=100)
    meters["wps"].__dict__.update(init=0, start=1.5e9, n=1000)
    monkeypatch.setitem(sys.modules, "fairseq", types.ModuleType("fairseq"))
    monkeypatch.setitem(sys.modules, "fairseq.meters", module)
    release = edited_release(fairseq_release[0], tmp_path / "release",
                             checkpoint=lambda s: {**s, "extra_state": {"train_meters": meters}})
    monkeypatch.delitem(sys.modules, "fairseq.meters")
    monkeypatch.delitem(sys.modules, "fairseq")
    convert.main(["fairseq", str(release), str(tmp_path / "out")])
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_a_fairseq_folder_that_cannot_be_converted_is_one_line_before_anything_is_written(fairseq_release, tmp_path,
                                                                                          capfd):
    """Foreign classes in the pickle are named and never unpickled; missing files, another kind of checkpoint, a
    damaged one, dictionaries that differ or do not fit the embedding: one line each, and OUT is not written."""
    from fractions import Fraction

    fairseq_release, out = fairseq_release[0], tmp_path / "out"
    embedding = "encoder.embed_tokens.weight"
    cases = {
        "is refused: it holds fractions.Fraction (only": {"checkpoint": lambda s: {**s, "extra_state": Fraction(1)}},
        "has no dict.de.txt, bpecodes": {"remove": ("dict.de.txt", "bpecodes")},
        "has no model.pt": {"remove": ("model.pt",)},
        "not a fairseq checkpoint with its training arguments (it holds ['model'])":
            {"checkpoint": lambda state: {"model": state["model"]}},
        "source and target dictionaries differ": {"dictionary": lambda text: "x" + text},
        "its dictionary has": {"checkpoint": lambda s: {**s, "model": {**s["model"],
                                                                       embedding: s["model"][embedding][1:]}}},
        "do not fit the model its config describes (missing: model.encoder.layers.1.fc1.weight)": {"checkpoint":
            lambda s: {**s, "model": {k: v for k, v in s["model"].items() if k != "encoder.layers.1.fc1.weight"}}},
        "(missing: model.encoder.layers.1.fc1.bias, model.encoder.layers.1.fc1.weight, model.encoder.layers.1.fc2.bias"
        ", ...; not ours: model.encoder.extra; of another shape: model.decoder.layers.0.fc1.weight)": {"checkpoint":
            lambda s: {**s, "model": {**{k: v for k, v in s["model"].items() if ".layers.1." not in k
                                         or not k.startswith("encoder.")},
                                      "encoder.extra": torch.zeros(1),
                                      "decoder.layers.0.fc1.weight": s["model"]["decoder.layers.0.fc1.weight"][1:]}}},
        "has encoder_learned_pos, which vaswani_hf does not compute": {"checkpoint": lambda s: {
            **s, "args": argparse.Namespace(**{**vars(s["args"]), "encoder_learned_pos": True})}},
        "has activation_fn='tanh', which vaswani_hf does not compute": {"checkpoint": lambda s: {
            **s, "args": argparse.Namespace(**{**vars(s["args"]), "activation_fn": "tanh"})}},
        "has encoder_normalize_before != decoder_normalize_before, layernorm_embedding, which": {
            "checkpoint": lambda s: {**s, "args": argparse.Namespace(**{
                **vars(s["args"]), "decoder_normalize_before": True, "layernorm_embedding": True})}},
        "dict.de.txt, line 1: not \"word count\" ('Hund')": {"dictionary": lambda text: "Hund\n" + text},
        "dict.de.txt, line 1: not \"word count\" ('Hund viele')": {"dictionary": lambda text: "Hund viele\n" + text},
    }
    for number, (expected, edit) in enumerate(cases.items()):
        release = edited_release(fairseq_release, tmp_path / f"case{number}", **edit)
        message = refusal(capfd, convert.main, "fairseq", release, out)
        assert expected in message, message
        assert not out.exists() and not list(tmp_path.glob(".out.*"))
    damaged = edited_release(fairseq_release, tmp_path / "damaged")
    (damaged / "model.pt").write_bytes((fairseq_release / "model.pt").read_bytes()[:1000])
    assert "not a readable torch checkpoint" in refusal(capfd, convert.main, "fairseq", damaged, out)
    with torch.serialization.safe_globals([argparse.Namespace]):  # as fairseq saved before torch 1.6, cut short
        state = torch.load(fairseq_release / "model.pt", weights_only=True, map_location="cpu")
    legacy = io.BytesIO()
    torch.save(state, legacy, _use_new_zipfile_serialization=False)
    (damaged / "model.pt").write_bytes(legacy.getvalue()[:100])
    assert "not a readable torch checkpoint (it ends too soon)" in refusal(capfd, convert.main, "fairseq", damaged,
                                                                            out)


def test_fairseqs_dictionary_lines_with_the_overwrite_flag_are_words(tmp_path):
    """fairseq's Dictionary reads "word count #fairseq:overwrite" (a symbol that may repeat one) as that word."""
    (tmp_path / "dict.en.txt").write_text("Hund 12\n<mask> 1 #fairseq:overwrite\nHaus 3\n", encoding="utf-8")
    assert convert.read_dictionary(tmp_path / "dict.en.txt") == [*convert.FAIRSEQ_SPECIALS, "Hund", "<mask>", "Haus"]


def write_fsmt(folder, share_all: bool = True, scale_embedding: bool = True, activation: str = "relu"):
    """An FSMT folder as the Hub holds facebook/wmt19-en-de, and the FSMT model in it: write_fairseq's random model
    with its tokenizer (`FSMTTokenizer`), its training's dropouts, decoding with a beam of 5 and length penalty 1.1
    (as the Hub's do)."""
    release = folder.parent / f"{folder.name}-release"
    fsmt = write_fairseq(release, fused=False, old_names=False, share_all=share_all, scale_embedding=scale_embedding,
                         activation=activation)
    words = convert.read_dictionary(release / "dict.en.txt")
    fsmt.config.update({"dropout": 0.3, "attention_dropout": 0.1, "activation_dropout": 0.2})
    fsmt.generation_config.update(num_beams=5, length_penalty=1.1, max_length=40)
    fsmt.save_pretrained(folder)
    convert.fsmt_tokenizer(words, release / "bpecodes", "en", "de").save_pretrained(folder)
    return fsmt


@pytest.mark.parametrize("layout", [{}, {"share_all": False, "scale_embedding": False, "activation": "gelu"}],
                         ids=["one embedding matrix", "own source embedding, unscaled, GELU"])
def test_a_converted_fsmt_model_gives_fsmts_logits_translations_and_ids(tmp_path, layout):
    """`vaswani-convert fsmt`, against the FSMT model converted: its tokenizer's ids, logits within 1e-5, greedy and
    beam outputs token for token, and its own decoding (its generation config: beam 5, length penalty 1.1); the three
    embeddings tied only where FSMT's are one matrix; its dropouts and positions."""
    fsmt, share_all = write_fsmt(tmp_path / "fsmt", **layout), not layout
    convert.main(["fsmt", str(tmp_path / "fsmt"), str(tmp_path / "converted")])
    ours = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "converted").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "converted")
    sentences = SENTENCES + MOSES_SENTENCES
    reference = AutoTokenizer.from_pretrained(tmp_path / "fsmt")
    assert tokenizer(sentences)["input_ids"] == reference(sentences)["input_ids"]
    config = ours.config
    assert (config.tie_word_embeddings, config.scale_embedding) == (share_all, share_all)
    assert (config.dropout, config.attention_dropout, config.activation_dropout, config.max_position_embeddings) == (
        0.3, 0.1, 0.2, 128)
    assert_computes_as_fsmt(ours, fsmt, tokenizer, sentences, {"length_penalty": 1.1})
    inputs = tokenizer(SENTENCES[:24], return_tensors="pt", padding=True)
    assert torch.equal(ours.generate(**inputs), fsmt.generate(**inputs))  # each with its generation config
    assert "The weights of the FSMT model" in (tmp_path / "converted" / "README.md").read_text(encoding="utf-8")


def test_an_fsmt_model_that_cannot_be_converted_is_one_line_before_anything_is_written(tmp_path, capfd):
    """Another kind of model, what FSMT computes and vaswani_hf does not (vocabularies of two sizes or of different
    words, other encoder and decoder widths or heads, other special tokens), a tokenizer that does not fit: one line
    each, and OUT is not written."""
    source, out = tmp_path / "fsmt", tmp_path / "out"
    write_fsmt(source)
    vocab = json.loads((source / "vocab-tgt.json").read_text(encoding="utf-8"))
    words = list(vocab)
    cases = {
        "holds a 'marian' model, not an FSMT one": {"config": {"model_type": "marian"}},
        "has vocabularies of": {"config": {"tgt_vocab_size": 7}},
        "has encoder_ffn_dim != decoder_ffn_dim, encoder_attention_heads != decoder_attention_heads, "
        "activation_function='tanh', which": {
            "config": {"decoder_ffn_dim": 8, "decoder_attention_heads": 2, "activation_function": "tanh"}},
        "has special tokens {'bos_token_id': 0, 'pad_token_id': 1, 'eos_token_id': 2, 'decoder_start_token_id': 0}":
            {"config": {"decoder_start_token_id": 0}},
        "its source and target vocabularies differ": {
            "vocab-tgt.json": {**vocab, words[9]: vocab[words[10]], words[10]: vocab[words[9]]}},
        "tokens but its embeddings": {"vocab-src.json": dict(list(vocab.items())[:-1]),
                                      "vocab-tgt.json": dict(list(vocab.items())[:-1])},
    }
    for number, (expected, edits) in enumerate(cases.items()):
        edited = shutil.copytree(source, tmp_path / f"case{number}")
        for name, values in edits.items():
            path = edited / ("config.json" if name == "config" else name)
            written = {**json.loads(path.read_bytes()), **values} if name == "config" else values
            path.write_text(json.dumps(written), encoding="utf-8")
        message = refusal(capfd, convert.main, "fsmt", edited, out)
        assert expected in message, message
        assert not out.exists() and not list(tmp_path.glob(".out.*"))


def test_a_converted_fairseq_folder_translates_exports_and_publishes(fairseq_release, tmp_path, cli):
    """vaswani-translate decodes as Ott et al. did (beam 4, length penalty 0.6: FSMT's generate() with those); the
    published files alone make the folder's pipeline; CTranslate2 scores pairs as the model does."""
    import ctranslate2
    from transformers import pipeline

    from vaswani_hf.tools import export
    from vaswani_hf.tools.hub import published_files

    release, fsmt = fairseq_release
    converted = tmp_path / "converted"
    convert.main(["fairseq", str(release), str(converted), "--license", "mit"])
    assert "under its license (mit)" in (converted / "README.md").read_text(encoding="utf-8")
    generation = json.loads((converted / "generation_config.json").read_bytes())  # fairseq-generate's of Ott et al.
    assert (generation["num_beams"], generation["length_penalty"], generation["max_new_tokens"]) == (4, 0.6, 200)
    tokenizer = AutoTokenizer.from_pretrained(converted)
    sources = SENTENCES[:10]
    published = fsmt.generate(**tokenizer(sources, return_tensors="pt", padding=True), num_beams=4,
                              length_penalty=0.6, early_stopping=True, max_new_tokens=200)
    expected = tokenizer.batch_decode(published, skip_special_tokens=True)
    result = cli("--model", converted, "--quiet", "--no_fast_cpu", stdin="\n".join(sources) + "\n")
    assert result.returncode == 0 and result.stdout.splitlines() == expected, result.stderr

    files = set(published_files(converted))
    assert {"vocab-src.json", "vocab-tgt.json", "merges.txt", "tokenizer_config.json", "README.md"} <= files
    (tmp_path / "published").mkdir()
    for name in files:
        shutil.copy(converted / name, tmp_path / "published" / name)
    translate = pipeline("translation", model=str(tmp_path / "published"), trust_remote_code=True)
    assert [row["translation_text"] for row in translate(sources, batch_size=4)] == expected

    export.main(["ctranslate2", str(converted), str(tmp_path / "ct2")])
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=torch.get_num_threads())
    ours = AutoModelForSeq2SeqLM.from_pretrained(converted).eval()
    pairs = list(zip(SENTENCES[:6], SENTENCES[6:12], strict=True))
    tokens = [tokenizer.convert_ids_to_tokens(tokenizer(source)["input_ids"]) for source, _ in pairs]
    targets = [tokenizer.convert_ids_to_tokens(tokenizer(target)["input_ids"])[:-1] for _, target in pairs]
    for (source, target), result in zip(pairs, translator.score_batch(tokens, targets), strict=True):
        inputs = tokenizer(source, text_target=target, return_tensors="pt")
        with torch.no_grad():
            log_probs = ours(**inputs).logits.log_softmax(-1)[0].gather(-1, inputs["labels"][0, :, None])[:, 0]
        torch.testing.assert_close(torch.tensor(result.log_probs), log_probs, atol=1e-4, rtol=0)
