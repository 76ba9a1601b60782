"""`vaswani-convert`: a converted model computes what its source computes. The sources are random-weight stand-ins
built here in their own format (nothing is downloaded): a MarianMTModel folder with a SentencePiece tokenizer, as
OPUS-MT's are laid out. Their reference is transformers' own implementation of each."""

import json
import shutil

import pytest
import torch
from conftest import CODE_FILES, refusal, run_hidden
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, MarianConfig, MarianMTModel, MarianTokenizer

from training.default_data import generate
from vaswani_hf import convert

SENTENCES = [en for en, _ in generate()["test"][:300]]


def write_marian(folder, seed: int = 0, **overrides) -> None:
    """A tiny MarianMTModel in OPUS-MT's layout: a unigram SentencePiece model shared by both sides, vocab.json with
    </s> 0, <unk> 1 and <pad> last (the decoder's start), swish, scaled embeddings, a random output bias, and the
    generation config OPUS-MT models are published with (beam 4, never <pad>). The weights are drawn wide (std 0.3)
    so that the decoding choices are real ones."""
    import sentencepiece

    folder.mkdir(parents=True)
    pairs = generate()["train"][:3000]
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([text for pair in pairs for text in pair]), model_prefix=str(folder / "spm"),
        vocab_size=200, model_type="unigram", character_coverage=1.0, minloglevel=2)
    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    vocab = ["</s>", "<unk>", *[piece for piece in pieces if piece not in ("<s>", "</s>", "<unk>")], "<pad>"]
    (folder / "vocab.json").write_text(json.dumps({piece: i for i, piece in enumerate(vocab)}))
    MarianTokenizer(*(str(folder / name) for name in ("spm.model", "spm.model", "vocab.json")), source_lang="en",
                    target_lang="de").save_pretrained(folder)
    pad = len(vocab) - 1
    values = {"vocab_size": len(vocab), "d_model": 16, "encoder_layers": 2, "decoder_layers": 3, "encoder_ffn_dim": 24,
              "decoder_ffn_dim": 24, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
              "activation_function": "swish", "scale_embedding": True, "max_position_embeddings": 128,
              "pad_token_id": pad, "decoder_start_token_id": pad, "eos_token_id": 0, "forced_eos_token_id": 0,
              "init_std": 0.3, "dropout": 0.1, **overrides}
    torch.manual_seed(seed)
    marian = MarianMTModel(MarianConfig(**values))
    marian.final_logits_bias.normal_()
    marian.generation_config.update(num_beams=4, max_length=40, bad_words_ids=[[pad]])
    marian.save_pretrained(folder)
    (folder / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n\n# opus-mt-en-de (a stand-in)\n")


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
    card = ModelCard.load(converted / "README.md")
    assert card.data.license == "cc-by-4.0" and "`activation_function='swish'`" in card.text
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


def test_the_converted_tokenizer_gives_marians_ids_and_text(marian_pair):
    source, converted = marian_pair
    ours, reference = AutoTokenizer.from_pretrained(converted), MarianTokenizer.from_pretrained(source)
    assert ours(SENTENCES)["input_ids"] == reference(SENTENCES)["input_ids"]
    ids = reference(text_target=SENTENCES[:50])["input_ids"]
    assert ours.batch_decode(ids, skip_special_tokens=True) == reference.batch_decode(ids, skip_special_tokens=True)


def test_vaswani_translate_decodes_a_converted_model_as_published(marian_pair, cli):
    """Without --alpha the source's own decoding (beam 4, transformers' length normalization); with --alpha the
    paper's GNMT search."""
    source, converted = marian_pair
    marian, tokenizer = MarianMTModel.from_pretrained(source).eval(), MarianTokenizer.from_pretrained(source)
    sources = SENTENCES[:12]
    expected = tokenizer.batch_decode(marian.generate(**batch(source, sources)), skip_special_tokens=True)
    result = cli("--model", converted, "--quiet", "--no_fast_cpu", stdin="\n".join(sources) + "\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == expected
    paper = cli("--model", converted, "--quiet", "--no_fast_cpu", "--alpha", "0.6", stdin="\n".join(sources) + "\n")
    assert paper.returncode == 0 and paper.stdout.count("\n") == len(sources)


def test_a_converted_model_loads_without_the_package_and_exports(marian_pair, tmp_path):
    """Remote code in a fresh Python without vaswani_hf decodes as the package does; CTranslate2's greedy decoding of
    the export (its swish and output bias included) is ours token for token."""
    import ctranslate2

    from vaswani_hf import export

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


def edited_copy(source, folder, **config):
    """A copy of the Marian folder `source` with entries of its config.json replaced."""
    shutil.copytree(source, folder)
    values = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**values, **config}))
    return folder


def test_what_cannot_be_converted_is_one_line_before_anything_is_written(marian_pair, tmp_path, capfd):
    source, converted = marian_pair
    out = tmp_path / "out"
    cases = {
        "exists: give a folder that does not": (source, converted),
        "no config.json": (tmp_path, out),  # an empty folder
        "holds a 'vaswani' model, not a Marian one": (converted, out),
        "separate source and target vocabularies": (edited_copy(source, tmp_path / "separate",
                                                                share_encoder_decoder_embeddings=False), out),
        "encoder_ffn_dim != decoder_ffn_dim": (edited_copy(source, tmp_path / "ffn", decoder_ffn_dim=32), out),
        "activation_function='tanh'": (edited_copy(source, tmp_path / "tanh", activation_function="tanh"), out),
    }
    for expected, (model, output) in cases.items():
        message = refusal(capfd, convert.main, "marian", model, output)
        assert expected in message, message
        assert not out.exists() and not list(tmp_path.glob(".out.*"))
    mismatch = edited_copy(source, tmp_path / "mismatch")
    vocab = json.loads((mismatch / "vocab.json").read_text())
    (mismatch / "vocab.json").write_text(json.dumps(dict(list(vocab.items())[:-3])))  # another vocabulary's
    message = refusal(capfd, convert.main, "marian", mismatch, out)
    assert "tokens but its embedding 200 rows" in message and not out.exists()


def test_the_converted_folder_publishes_and_pipelines_as_one_of_ours(marian_pair, tmp_path):
    """vaswani-push sends the weights, config, generation config, code, card and Marian's tokenizer files, and those
    files alone translate as the folder does; the folder's translation pipeline decodes as published."""
    from transformers import pipeline

    from vaswani_hf.hub import published_files

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
