"""Data, tokenizer and batching of the recipe (§5.1)."""

import bz2
import collections
import errno
import gzip
import itertools
import json
import lzma
import re
from types import SimpleNamespace

import numpy as np
import pytest
from datasets import Dataset, DatasetDict
from transformers import AutoTokenizer

from training.batching import padding_fraction, token_batches
from training.data import DataError, as_pairs, load_pairs, load_run_data, load_splits
from training.default_data import generate
from training.tokenizer import train_joint_bpe


def test_the_embedded_default_data_is_what_the_generator_writes():
    """Every pair of every split of training/data/default/ is the generator's (training/default_data.py), in order."""
    pairs = load_pairs("en", "de")
    generated = generate()
    assert {split: len(p) for split, p in pairs.items()} == {"train": 30000, "validation": 500, "test": 500}
    assert pairs == generated
    english = [{en for en, _ in p} for p in pairs.values()]
    assert not (english[0] & english[1]) and not (english[0] & english[2])  # disjoint splits


# A grammar book's forms: an English noun phrase in German as subject, object and after "mit" (nom., acc., dat.).
DECLINED = {
    "the old dog": ("der alte Hund", "den alten Hund", "dem alten Hund"),
    "an old dog": ("ein alter Hund", "einen alten Hund", "einem alten Hund"),
    "my old dog": ("mein alter Hund", "meinen alten Hund", "meinem alten Hund"),
    "the old cat": ("die alte Katze", "die alte Katze", "der alten Katze"),
    "an old cat": ("eine alte Katze", "eine alte Katze", "einer alten Katze"),
    "my old cat": ("meine alte Katze", "meine alte Katze", "meiner alten Katze"),
    "the old house": ("das alte Haus", "das alte Haus", "dem alten Haus"),
    "an old house": ("ein altes Haus", "ein altes Haus", "einem alten Haus"),
    "my old house": ("mein altes Haus", "mein altes Haus", "meinem alten Haus"),
    "the old dogs": ("die alten Hunde", "die alten Hunde", "den alten Hunden"),
    "my old houses": ("meine alten Häuser", "meine alten Häuser", "meinen alten Häusern"),
    "the children": ("die Kinder", "die Kinder", "den Kindern"),
    "a girl": ("ein Mädchen", "ein Mädchen", "einem Mädchen"),
}
# Sentence openings: verb agreement, verb second after a fronted adverb, "in dem" contracted.
OPENINGS = {"The dogs see ": "Die Hunde sehen ", "We like ": "Wir mögen ", "She likes ": "Sie mag ",
            "Today the dog sees ": "Heute sieht der Hund ", "Now they have ": "Jetzt haben sie "}
FRONTED = "Today|Now|Tomorrow|Often|Again"  # the adverbs that may open a sentence: the German verb comes next
PLACES = {" in the garden.": " im Garten.", " in the city.": " in der Stadt.", " in the house.": " im Haus."}


def test_the_embedded_grammar_declines_agrees_and_orders_as_german_does():
    """Every pair of the embedded data that holds one of the phrases above holds its German where German grammar puts
    it (each phrase found in each of its places at least once); no English "a" stands before a vowel."""
    pairs = [pair for split in generate().values() for pair in split]
    capital = lambda text: text[0].upper() + text[1:]
    checked = collections.Counter()
    for english, german in pairs:
        assert not re.search(r"\ba [aeiou]", english, re.IGNORECASE), english
        for phrase, (nominative, accusative, dative) in DECLINED.items():
            if english.startswith(capital(phrase) + " "):  # the subject
                assert german.startswith(capital(nominative) + " "), (english, german)
                checked[phrase, "nom"] += 1
            if re.search(f"^(?!(?:{FRONTED}) ).*(?<!with) {phrase}[ .]", english):  # the object: after the verb
                assert re.search(f"(?<!mit) {accusative}[ .]", german), (english, german)
                checked[phrase, "acc"] += 1
            if re.search(f" with {phrase}[ .]", english):
                assert re.search(f" mit {dative}[ .]", german), (english, german)
                checked[phrase, "dat"] += 1
        for start, expected in OPENINGS.items():
            assert not english.startswith(start) or german.startswith(expected), (english, german)
            checked[start] += english.startswith(start)
        for end, expected in PLACES.items():
            assert not english.endswith(end) or german.endswith(expected), (english, german)
            checked[end] += english.endswith(end)
    assert all(checked[key] for key in [*OPENINGS, *PLACES]), checked
    assert all(checked[phrase, case] for phrase in DECLINED for case in ("nom", "acc", "dat")), checked


def test_json_lines_and_aligned_text_load_the_same_pairs(tmp_path):
    rows = [("A dog .", "Ein Hund ."), ("Two cats .", "Zwei Katzen .")]
    with open(tmp_path / "train.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"translation": {"en": en, "de": de}}) + "\n" for en, de in rows)
    (tmp_path / "valid.en").write_text("\n".join(en for en, _ in rows) + "\n", encoding="utf-8")
    (tmp_path / "valid.de").write_text("\n".join(de for _, de in rows) + "\n", encoding="utf-8")
    files = {"train": str(tmp_path / "train.jsonl"), "validation": str(tmp_path / "valid")}
    pairs = load_pairs("en", "de", files=files)
    assert pairs == {"train": rows, "validation": rows}
    assert load_pairs("de", "en", files={"train": files["train"]})["train"][0] == ("Ein Hund .", "A dog .")
    assert load_pairs("en", "de", files=files, streaming=True) == pairs  # read as a stream: the same pairs
    (tmp_path / "train.json").write_bytes((tmp_path / "train.jsonl").read_bytes())  # JSON lines named .json
    assert load_pairs("en", "de", files={"train": str(tmp_path / "train.json")})["train"] == rows


def test_a_runs_splits_are_read_each_from_its_own_flag(tmp_path):
    rows = {split: [(f"{i} {split} .", f"{i} {split} ..") for i in range(size)]
            for size, split in enumerate(("train", "validation", "test"), 2)}
    for split, pairs in rows.items():
        (tmp_path / f"{split}.jsonl").write_text(
            "".join(json.dumps({"translation": {"en": en, "de": de}}) + "\n" for en, de in pairs), encoding="utf-8")
    flags = SimpleNamespace(source_lang="en", target_lang="de", dataset_name=None, dataset_config_name=None,
                            streaming=False, **{f"{split}_file": str(tmp_path / f"{split}.jsonl") for split in rows})
    assert {split: as_pairs(dataset) for split, dataset in load_run_data(flags).items()} == rows


def test_a_column_per_language_loads_as_the_translation_column_and_other_columns_are_one_line_errors(tmp_path):
    """JSON lines {"en": ..., "de": ...} (the layout of bentrevett/multi30k on the Hub) give the pairs that
    {"translation": {...}} gives; a translation column without the languages asked for, or neither layout, is a
    one-line ValueError that names what the file holds."""
    rows = [("A dog .", "Ein Hund ."), ("Two cats .", "Zwei Katzen .")]
    layouts = {"columns": [{"id": i, "en": en, "de": de} for i, (en, de) in enumerate(rows)],
               "other languages": [{"translation": {"en": en, "fr": de}} for en, de in rows],
               "no languages": [{"text": en, "label": de} for en, de in rows],
               "no target column": [{"en": en, "fr": de} for en, de in rows]}
    for name, lines in layouts.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    read = lambda name, languages=("en", "de"): load_pairs(*languages, files={"train": f"{tmp_path}/{name}.jsonl"})
    assert read("columns") == {"train": rows}
    assert read("columns", ("de", "en"))["train"][0] == ("Ein Hund .", "A dog .")
    with pytest.raises(ValueError, match=r"^the translation column has languages \['en', 'fr'\], not en and de$"):
        read("other languages")
    with pytest.raises(ValueError, match=r"^the translation column has languages \['en', 'fr'\], not de and fr$"):
        read("other languages", ("de", "fr"))  # the source side missing
    with pytest.raises(ValueError, match=r"^no 'translation' column and no 'en'/'de' columns in \['text', 'label'\]$"):
        read("no languages")
    with pytest.raises(ValueError, match=r"^no 'translation' column and no 'en'/'de' columns in \['en', 'fr'\]$"):
        read("no target column")


def test_json_lines_that_do_not_parse_or_hold_no_text_are_one_line_errors_naming_the_line(tmp_path, caplog):
    """A line that is not JSON is named by its number in the file (pyarrow's own error counts objects within a
    block, and datasets' log line of it is not shown); a pair whose text is missing, null or a number, or a null
    pair, is named by its number, read whole or streamed."""
    good = json.dumps({"translation": {"en": "A dog .", "de": "Ein Hund ."}})
    (tmp_path / "cut.jsonl").write_text(f"{good}\n\n{good}\n{good[:30]}\n{good}\n",
                                        encoding="utf-8")  # cut short on line 4
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress((tmp_path / "cut.jsonl").read_bytes()))
    for name, streaming, message in (("cut.jsonl", False, "line 4 is not JSON: "),
                                     ("cut.jsonl.gz", False, "line 4 is not JSON: "),
                                     ("cut.jsonl", True, "JSON parse error")):
        with pytest.raises(DataError, match=f"^--train_file {tmp_path}/{name}: {message}"):
            load_splits("en", "de", files={"train": str(tmp_path / name)}, streaming=streaming)
    assert not caplog.records  # (datasets logs "Failed to load JSON" at the error level)
    layouts = {"null": [{"translation": {"en": "A dog .", "de": "Ein Hund ."}}, {"translation": {"en": "Two ."}}],
               "number": [{"en": "A dog .", "de": "Ein Hund ."}, {"en": "Two .", "de": 2}],
               "no pair": [{"translation": {"en": "A dog .", "de": "Ein Hund ."}}, {"translation": None}]}
    for name, rows in layouts.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        lang, held = {"null": ("de", "None"), "number": ("de", "2"), "no pair": ("en", "None")}[name]
        for streaming in (False, True):
            with pytest.raises(DataError, match=rf"^--train_file {tmp_path}/{name}.jsonl: pair 2 has no {lang} text "
                                                rf"\(it holds {held}\)$"):
                as_pairs(load_splits("en", "de", files={"train": str(tmp_path / f"{name}.jsonl")},
                                     streaming=streaming)["train"])


def dataset_folder(folder, splits: dict[str, list[tuple[str, str]]]) -> str:
    """A folder laid out as a Hub dataset repository: JSON lines per split, named in its README's configs."""
    (folder / "data").mkdir(parents=True)
    listed = ""
    for split, rows in splits.items():
        (folder / "data" / f"{split}.jsonl").write_text(
            "".join(json.dumps({"translation": {"en": en, "de": de}}) + "\n" for en, de in rows), encoding="utf-8")
        listed += f"  - split: {split}\n    path: data/{split}.jsonl\n"
    (folder / "README.md").write_text(f"---\nconfigs:\n- config_name: default\n  data_files:\n{listed}---\n",
                                      encoding="utf-8")
    return str(folder)


def test_a_dataset_repository_gives_its_train_valid_and_test_splits_and_an_empty_one_stops_the_run(tmp_path):
    """--dataset_name (a Hub repository; here a folder laid out as one): its "valid" split read as validation, a
    split of another name left out, whole or streamed; an empty split stops the run in one line."""
    rows = [(f"{n} dogs .", f"{n} Hunde .") for n in range(4)]
    name = dataset_folder(tmp_path / "repository", {"train": rows, "valid": rows[:2], "extra": rows[:1]})
    for streaming in (False, True):
        assert load_pairs("en", "de", dataset_name=name, streaming=streaming) == {"train": rows,
                                                                                 "validation": rows[:2]}
    empty = dataset_folder(tmp_path / "empty", {"train": rows, "test": []})
    for streaming in (False, True):
        flags = SimpleNamespace(source_lang="en", target_lang="de", dataset_name=empty, dataset_config_name=None,
                                train_file=None, validation_file=None, test_file=None, streaming=streaming)
        with pytest.raises(SystemExit, match=f"^error: the test split has no pairs \\({empty}\\)$"):
            load_run_data(flags)


def test_a_local_folder_of_csv_files_or_a_saved_dataset_gives_its_pairs_whole_or_streamed(tmp_path):
    """--dataset_name FOLDER, as `datasets.load_dataset` reads a folder: CSV files with a column per language (a comma
    and quotes inside a sentence), and a DatasetDict written by `save_to_disk` with a translation column."""
    import csv

    rows = [(f'{n} dogs, "big" ones .', f'{n} Hunde, "große" .') for n in range(4)]
    (tmp_path / "csv").mkdir()
    for split, part in (("train", rows), ("validation", rows[:2])):
        with open(tmp_path / "csv" / f"{split}.csv", "w", newline="", encoding="utf-8") as file:
            csv.writer(file).writerows([("de", "en"), *((de, en) for en, de in part)])
    DatasetDict({split: Dataset.from_dict({"translation": [{"en": en, "de": de} for en, de in part]})
                 for split, part in (("train", rows), ("test", rows[2:]))}).save_to_disk(tmp_path / "saved")
    for streaming in (False, True):
        assert load_pairs("en", "de", dataset_name=str(tmp_path / "csv"), streaming=streaming) == {
            "train": rows, "validation": rows[:2]}
        assert load_pairs("de", "en", dataset_name=str(tmp_path / "saved"), streaming=streaming) == {
            "train": [(de, en) for en, de in rows], "test": [(de, en) for en, de in rows[2:]]}


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz"])
def test_compressed_files_give_the_pairs_of_the_files_they_compress(tmp_path, compression):
    """JSON lines and aligned text (beside an uncompressed side, or misaligned) read through the compression."""
    pairs = [(f"{n} dogs .", f"{n} Hunde .") for n in range(5)]
    compress = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}[compression]
    rows = "".join(json.dumps({"translation": {"en": en, "de": de}}) + "\n" for en, de in pairs)
    (tmp_path / f"t.jsonl.{compression}").write_bytes(compress(rows.encode()))
    assert load_pairs("en", "de", files={"train": str(tmp_path / f"t.jsonl.{compression}")})["train"] == pairs
    (tmp_path / f"a.en.{compression}").write_bytes(compress("".join(en + "\n" for en, _ in pairs).encode()))
    (tmp_path / "a.de").write_text("".join(de + "\n" for _, de in pairs), encoding="utf-8")
    assert load_pairs("en", "de", files={"train": str(tmp_path / "a")})["train"] == pairs
    (tmp_path / "a.de").write_text("".join(de + "\n" for _, de in pairs[:4]), encoding="utf-8")
    with pytest.raises(ValueError, match="5 en lines but 4 de lines"):
        load_pairs("en", "de", files={"train": str(tmp_path / "a")})


def test_missing_or_misaligned_files_are_one_line_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="--train_file .*nope.jsonl"):
        load_pairs("en", "de", files={"train": str(tmp_path / "nope.jsonl")})
    (tmp_path / "x.en").write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "x.de").write_text("a\n", encoding="utf-8")
    with pytest.raises(ValueError, match="2 en lines but 1 de lines"):
        load_pairs("en", "de", files={"test": str(tmp_path / "x")})
    (tmp_path / "x.de").write_text("", encoding="utf-8")  # one side empty: misaligned, not an empty split
    with pytest.raises(ValueError, match="2 en lines but 0 de lines"):
        load_pairs("en", "de", files={"test": str(tmp_path / "x")})
    (tmp_path / "blank.jsonl.gz").write_bytes(gzip.compress(b"\n \n"))  # JSON lines of no pairs
    with pytest.raises(ValueError, match=f"^the validation split has no pairs \\({tmp_path}/blank.jsonl.gz\\)$"):
        load_pairs("en", "de", files={"validation": str(tmp_path / "blank.jsonl.gz")})


def test_a_mistake_in_the_validation_or_test_file_is_refused_before_the_training_pairs_are_read(tmp_path, monkeypatch):
    """Reading WMT's training pairs takes minutes: a missing or misaligned validation or test file, aligned text or
    JSON lines, is refused first. The splits come back in the flags' order."""
    from training import data as data_module

    read, aligned_tables, json_lines = [], data_module._aligned_tables, data_module._json_lines
    monkeypatch.setattr(data_module, "_aligned_tables", lambda *args: read.append(args[3]) or aligned_tables(*args))
    monkeypatch.setattr(data_module, "_json_lines", lambda *args: read.append(args[1]) or json_lines(*args))
    for name in ("train", "valid"):
        (tmp_path / f"{name}.en").write_text("A dog .\nA cat .\n", encoding="utf-8")
        (tmp_path / f"{name}.de").write_text("Ein Hund .\nEine Katze .\n", encoding="utf-8")
    (tmp_path / "test.en").write_text("A dog .\n", encoding="utf-8")
    (tmp_path / "test.de").write_text("Ein Hund .\nEine Katze .\n", encoding="utf-8")
    (tmp_path / "train.jsonl").write_text('{"en": "A dog .", "de": "Ein Hund ."}\n', encoding="utf-8")
    for train in ("train", "train.jsonl"):
        files = {"train": str(tmp_path / train), "validation": str(tmp_path / "valid"), "test": str(tmp_path / "test")}
        with pytest.raises(ValueError, match="--test_file .*: 1 en lines but 2 de lines"):
            load_splits("en", "de", files=files)
        with pytest.raises(FileNotFoundError, match="--validation_file .*nope.jsonl: no such file"):
            load_splits("en", "de", files={**files, "validation": str(tmp_path / "nope.jsonl"), "test": None})
        assert "train" not in read
        read.clear()
        with pytest.raises(FileNotFoundError, match="--train_file .*nope: expected JSON lines"):  # before the others
            load_splits("en", "de", files={**files, "train": str(tmp_path / "nope")})
        assert not read
        files["test"] = None
        assert list(load_splits("en", "de", files=files)) == ["train", "validation"]
        assert read.pop() == "train"


def test_a_file_or_folder_given_for_a_prefix_is_told_what_the_flag_takes(tmp_path):
    """--train_file names aligned files by their prefix: given one side's file (compressed too), it names the
    prefix; given a CSV or TSV file or a folder, it names --dataset_name, which reads them."""
    (tmp_path / "data").mkdir()
    for name in ("train.en", "train.de", "train.tsv"):
        (tmp_path / name).write_text("A dog .\n", encoding="utf-8")
    (tmp_path / "train.de.gz").write_bytes(gzip.compress(b"Ein Hund .\n"))
    for given, told in [("train.en", f"not found: give the prefix {tmp_path}/train, of both sides' files"),
                        ("train.de.gz", f"not found: give the prefix {tmp_path}/train, of both sides' files"),
                        ("train.tsv", ("not found: a CSV or TSV file whose first line names the languages goes in a "
                                       "folder given as --dataset_name")),
                        ("data", "not found: a folder that datasets reads is given as --dataset_name"),
                        ("nothing", "not found")]:
        with pytest.raises(FileNotFoundError) as error:
            load_pairs("en", "de", files={"train": str(tmp_path / given)})
        assert str(error.value).endswith(told), given


def test_aligned_files_rewritten_in_place_are_read_again(tmp_path):
    """datasets' cache of aligned text is named by the files' sizes and modification times: a file rewritten to the
    same size gives its new pairs, not the cached ones."""
    import os

    (tmp_path / "x.en").write_text("A dog .\n", encoding="utf-8")
    (tmp_path / "x.de").write_text("Ein Hund\n", encoding="utf-8")
    assert load_pairs("en", "de", files={"train": str(tmp_path / "x")})["train"] == [("A dog .", "Ein Hund")]
    (tmp_path / "x.de").write_text("Ein Hahn\n", encoding="utf-8")
    later = os.stat(tmp_path / "x.de").st_mtime_ns + 10**9  # (a clock too coarse to tell the writes apart)
    os.utime(tmp_path / "x.de", ns=(later, later))
    assert load_pairs("en", "de", files={"train": str(tmp_path / "x")})["train"] == [("A dog .", "Ein Hahn")]


def test_aligned_text_is_read_a_table_at_a_time_with_lines_counted_across_tables(tmp_path, monkeypatch):
    """training/data.py reads aligned files RECORD_BATCH lines at a time: the pairs are the lines split at "\\n"
    only (U+2028, form feed and a lone "\\r" stay inside a line; "\\r\\n" ends one), and a misaligned or
    non-UTF-8 line is reported with the counts and the line number of the whole file."""
    from training import data as data_module

    monkeypatch.setattr(data_module, "RECORD_BATCH", 2)
    english = ["One.", "Two\u2028halves.", "", "Three\fand\rmore.", "Last"]
    german = ["Eins.", "Zwei.", "", "Drei.", "Letzte"]
    (tmp_path / "t.en").write_bytes("\r\n".join(english).encode())
    (tmp_path / "t.de").write_bytes(("\n".join(german) + "\n").encode())
    assert load_pairs("en", "de", files={"train": str(tmp_path / "t")})["train"] == list(zip(english, german))
    (tmp_path / "m.en").write_text("\n".join(english) + "\n", encoding="utf-8")
    (tmp_path / "m.de").write_text("\n".join(german[:4]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="5 en lines but 4 de lines"):
        load_pairs("en", "de", files={"train": str(tmp_path / "m")})
    (tmp_path / "u.en").write_text("\n".join(english) + "\n", encoding="utf-8")
    (tmp_path / "u.de").write_bytes("Eins.\nZwei.\n\nCaf\u00e9.\nLetzte".encode("latin-1"))
    with pytest.raises(ValueError, match="u.de is not UTF-8 text: byte 0xe9 on line 4"):
        load_pairs("en", "de", files={"train": str(tmp_path / "u")})


def test_aligned_text_is_cached_in_arrow_record_batches_of_record_batch_rows(tmp_path):
    """Each record batch's header maps a page or more into every process that opens the file: RECORD_BATCH rows a
    batch, not datasets' default of 1,000, as in training/tokens.py."""
    from training.tokens import RECORD_BATCH

    lines = "".join(f"{n}\n" for n in range(RECORD_BATCH + 1))
    (tmp_path / "t.en").write_text(lines, encoding="utf-8")
    (tmp_path / "t.de").write_text(lines, encoding="utf-8")
    train = load_splits("en", "de", files={"train": str(tmp_path / "t")})["train"]
    assert [len(batch) for batch in train.data.to_batches()] == [RECORD_BATCH, 1]


def test_joint_bpe_round_trips_through_auto_tokenizer(tmp_path):
    pairs = load_pairs("en", "de")["train"][:3000]
    tokenizer = train_joint_bpe((side for pair in pairs for side in pair), vocab_size=600)
    assert [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id] == [0, 1, 2]
    assert 100 < len(tokenizer) <= 600  # this small grammar runs out of merges below 600
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    sentence = "Heute sieht der große Hund eine Katze im Garten."
    ids = loaded(sentence)["input_ids"]
    assert ids[-1] == loaded.eos_token_id and ids == tokenizer(sentence)["input_ids"]
    assert loaded.decode(ids, skip_special_tokens=True) == sentence
    assert loaded("Heute \u263a")["input_ids"][-2] == loaded.unk_token_id == 3  # a character no pair holds
    # However the words are spaced (tabs, line breaks, no-break and ideographic spaces, several): one space's tokens.
    assert loaded(" Heute\tsieht der\u00a0 große\nHund\u3000eine  Katze im Garten. \r")["input_ids"] == ids


def test_only_the_joint_bpes_pipeline_takes_the_word_cached_encoder():
    """is_joint_bpe: its normalizer (or NFKC alone), Metaspace, BPE without dropout, </s> appended; any other part, or
    no </s>, is not it."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    from training.tokenizer import is_joint_bpe

    pairs = generate()["train"][:300]
    joint = train_joint_bpe((side for pair in pairs for side in pair), 120).backend_tokenizer
    assert is_joint_bpe(joint)
    spec = json.loads(joint.to_str())
    nfkc = {**spec, "normalizer": json.loads(normalizers.NFKC().__getstate__())}  # earlier runs' tokenizers
    assert is_joint_bpe(Tokenizer.from_str(json.dumps(nfkc)))
    wordpiece = json.loads(Tokenizer(models.WordPiece(spec["model"]["vocab"], unk_token="<unk>")).to_str())["model"]
    changed = {"dropout": {**spec, "model": {**spec["model"], "dropout": 0.1}}, "model": {**spec, "model": wordpiece},
               "pre_tokenizer": {**spec, "pre_tokenizer": json.loads(pre_tokenizers.Whitespace().__getstate__())},
               "normalizer": {**spec, "normalizer": json.loads(normalizers.NFC().__getstate__())}}
    for name, other in changed.items():
        assert not is_joint_bpe(Tokenizer.from_str(json.dumps(other))), name
    no_eos = Tokenizer(models.BPE(vocab={"a": 0, "<unk>": 1}, merges=[], unk_token="<unk>"))
    no_eos.normalizer, no_eos.pre_tokenizer = normalizers.NFKC(), pre_tokenizers.Metaspace()
    assert not is_joint_bpe(no_eos)


def test_token_batches_respect_the_budget_cover_every_pair_and_depend_only_on_seed_and_epoch():
    import random
    rng = random.Random(0)
    source = [rng.randint(1, 40) for _ in range(2000)]
    target = [max(1, s + rng.randint(-5, 5)) for s in source]
    batches = as_lists(token_batches(source, target, max_tokens=500, seed=1, epoch=0))
    assert sorted(i for b in batches for i in b) == list(range(2000))
    assert all(len(b) * max(max(source[i], target[i]) for i in b) <= 500 for b in batches)
    assert batches == as_lists(token_batches(source, target, max_tokens=500, seed=1, epoch=0))
    assert batches != as_lists(token_batches(source, target, max_tokens=500, seed=1, epoch=1))
    assert padding_fraction(batches, source, target) < 0.15  # grouped by length: little padding
    unsorted = [list(range(k, k + len(b))) for k, b in zip(range(0, 2000, 20), batches)]
    assert padding_fraction(batches, source, target) < padding_fraction(unsorted, source, target)
    for some in (batches, unsorted, batches[:1], [[5]]):  # the formula, pair by pair
        real = sum(lengths[i] for b in some for i in b for lengths in (source, target))
        padded = sum(len(b) * max(lengths[i] for i in b) for b in some for lengths in (source, target))
        assert padding_fraction([np.asarray(b) for b in some], source, target) == pytest.approx(1 - real / padded)


def as_lists(batches) -> list[list[int]]:
    return [[int(i) for i in batch] for batch in batches]


def pair_by_pair_batches(source_lengths, target_lengths, max_tokens, seed, epoch) -> list[list[int]]:
    """§5.1 batching written pair by pair, as training/batching.py had it before it ran on arrays: the reference."""
    import random
    rng = random.Random(seed * 1_000_003 + epoch)
    noise = [rng.random() for _ in source_lengths]
    order = sorted(range(len(source_lengths)),
                   key=lambda i: (max(source_lengths[i], target_lengths[i]), source_lengths[i], noise[i]))
    batches, batch, longest = [], [], 0
    for index in order:
        length = max(source_lengths[index], target_lengths[index])
        if batch and (len(batch) + 1) * max(longest, length) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(index)
        longest = max(longest, length)
    if batch:
        batches.append(batch)
    rng.shuffle(batches)
    return batches


@pytest.mark.parametrize("max_tokens", [1, 37, 500, 4096])
def test_token_batches_on_arrays_are_the_pair_by_pair_batches(max_tokens):
    """The same batches, in the same order, as the pair-by-pair reference, for the same seed and epoch: lengths
    with many ties, pairs longer than max_tokens alone, every length up to 360 and up to 361 (the longest whose
    sort keys fit 16 bits, and the shortest whose do not), and the embedded data's own lengths."""
    import random
    rng = random.Random(max_tokens)
    source = [rng.choice([1, 2, 3, 7, 30, 120, 600]) for _ in range(3000)]
    target = [max(1, s + rng.randint(-3, 3)) for s in source]
    pairs = generate()["train"][:5000]
    embedded = [[len(side.split()) + 1 for side in sides] for sides in zip(*pairs)]
    spreads = [[[rng.randint(1, top) for _ in range(3000)] + [top] for _ in range(2)] for top in (360, 361)]
    for lengths in ((source, target), *spreads, embedded):
        for seed, epoch in ((1, 0), (1, 3), (7, 0)):
            expected = pair_by_pair_batches(*lengths, max_tokens, seed, epoch)
            assert as_lists(token_batches(*lengths, max_tokens, seed, epoch)) == expected
            arrays = [np.asarray(side) for side in lengths]
            assert as_lists(token_batches(*arrays, max_tokens, seed, epoch)) == expected


def test_the_processes_read_the_ids_of_their_share_of_each_steps_batches_leaving_out_overlong_pairs():
    """EpochBatches.step against the pairs as plain lists: for each of a process's batches of a step (the step's
    `accumulation` x processes batches, every processes-th from its rank), the ids of the batch's pairs, read from a
    table of several Arrow chunks, where pairs longer than max_length are not counted. Every step of an epoch on
    both processes, and one step of the third epoch."""
    import random

    from datasets import concatenate_datasets

    from training.batching import EpochBatches
    from training.tokens import FEATURES

    rng = random.Random(3)
    pairs = [tuple([rng.randrange(4, 60) for _ in range(rng.choice([1, 2, 5, 9, 14]))] for _ in range(2))
             for _ in range(600)]
    for first in (0, 250, 500):  # the first row of each chunk (below), kept
        pairs[first] = ([5], [6, 7])
    columns = lambda part: {"source_ids": [s for s, _ in part], "target_ids": [t for _, t in part],
                            "source_length": [len(s) for s, _ in part], "target_length": [len(t) for _, t in part]}
    train = concatenate_datasets([Dataset.from_dict(columns(pairs[k:k + 250]), features=FEATURES)
                                  for k in range(0, 600, 250)])
    assert train.data.column("source_ids").num_chunks == 3
    kept = [i for i, (s, t) in enumerate(pairs) if max(len(s), len(t)) <= 9]
    read = set()
    for rank in (0, 1):
        batches = EpochBatches(train, 9, 40, seed=2, accumulation=2, rank=rank, world=2)
        assert batches.skipped == 600 - len(kept) > 0
        for step in [*range(batches.steps_per_epoch), 2 * batches.steps_per_epoch + 1]:
            epoch, place = divmod(step, batches.steps_per_epoch)
            expected = token_batches([len(pairs[i][0]) for i in kept], [len(pairs[i][1]) for i in kept], 40, 2,
                                     epoch)
            mine = [expected[place * 4 + a * 2 + rank] for a in range(2)]
            assert [[[row.tolist() for row in side] for side in batch] for batch in batches.step(step)] == [
                [[pairs[kept[i]][side] for i in batch] for side in (0, 1)] for batch in mine]
            read.update(kept[i] for batch in mine for i in batch if epoch == 0)
    assert {0, 250, 500} <= read
    with pytest.raises(ValueError, match=r"^the training data makes \d+ batch\(es\) of at most 40 tokens \(\d+ of 600 "
                                         r"pairs over --max_length 9 left out\), fewer than the 2000 of one optimizer "
                                         r"step: lower --tokens_per_step or raise --max_length$"):
        EpochBatches(train, 9, 40, seed=2, accumulation=500, rank=0, world=4)  # a step: 500 batches on 4 processes


def test_the_word_cached_encoder_normalizes_only_text_the_normalizer_could_change():
    """Its shortcut: Latin-1 text without compatibility characters, with single spaces between words (or one before
    them), skips the normalizer; text with anything either normalizer may change takes it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from training.tokens import NORMALIZED

    plain = ["Ein Hund läuft über die Straße.", "Café, naïve; größer! (Ja)", " Vorne", "", "a"]
    odd = ["zwei  Leerzeichen", "am Ende ", "ein\tTab", "eine\nZeile", "ein\u00a0Raum", "\ufb01", "\u00bd", "x\u0301",
           "\u201eja\u201c"]
    matched = pc.match_substring_regex(pa.array(plain + odd), NORMALIZED).to_pylist()
    assert matched == [False] * len(plain) + [True] * len(odd)


@pytest.mark.parametrize("spaces", [True, False])  # the normalizer, and NFKC alone (earlier runs' tokenizers)
def test_the_word_cached_encoder_gives_the_tokenizers_ids_on_any_text(spaces):
    """training/tokens.py WordEncoder against the tokenizer itself: the embedded data, and random text mixing the
    cases its shortcuts must get right (spaces and ▁, tabs, line breaks, Latin-1's compatibility characters and white
    space, combining marks, full-width letters, ligatures, special tokens' strings, text NFKC changes into spaces or
    special tokens), with a cache small enough to be emptied along the way."""
    import random

    from tokenizers import Tokenizer

    from training.tokenizer import normalizer
    from training.tokens import TokenizerEncoder, WordEncoder, pair_encoder

    pairs = generate()["train"][:2000]
    tokenizer = train_joint_bpe((side for pair in pairs for side in pair), 300)
    tokenizer.backend_tokenizer.normalizer = normalizer(spaces)
    encoder = WordEncoder(tokenizer)
    encoder.CACHE_WORDS = 50
    texts = [side for pair in pairs for side in pair]
    pieces = [" ", "  ", "\t", "\n", "\x0b", "\x85", "\x1f", "\u2581", "\u00a0", "\u2028", "\u00b2", "\u00bd",
              "\u00e4", "a\u0308", "\u00df", "\ufb01", "\uff21", "\uff1c/s\uff1e", "</s>", "<pad>", "<unk",
              "\u201ehallo\u201c", "\u2013", "\u3000", "\U0001d400", "e", "The", "Hund", "x\u0301y", "\u212b",
              "\u2460", "."]
    rng = random.Random(0)
    texts += ["".join(rng.choices(pieces, k=rng.randint(0, 12))) for _ in range(3000)]
    texts += ["", " ", "\u2581", "The  Hund", " The", "The "]
    expected = tokenizer(texts)["input_ids"]
    assert encoder(texts) == expected and isinstance(pair_encoder(tokenizer), WordEncoder)
    tokenizer.backend_tokenizer.enable_truncation(4)  # as a tokenizer.json saved with a limit may ask
    tokenizer.backend_tokenizer.enable_padding(length=64)
    assert WordEncoder(tokenizer)(texts) == expected
    without_eos = SimpleNamespace(backend_tokenizer=Tokenizer.from_str(tokenizer.backend_tokenizer.to_str()))
    without_eos.backend_tokenizer.post_processor = None
    with pytest.raises(ValueError, match="joint BPE"):
        WordEncoder(without_eos)
    assert isinstance(pair_encoder(without_eos), TokenizerEncoder)  # a tokenizer of another pipeline: its own calls


# 300 pairs: in the main process (few pairs, or one core), or over a worker a core the process may use (3 of them)
@pytest.mark.parametrize(("parallel_from", "cores", "files"), [(10**9, 3, 1), (200, 3, 3), (200, 1, 1)])
def test_the_training_tokens_are_built_once_read_memory_mapped_and_rebuilt_for_other_data(tmp_path, monkeypatch,
                                                                                         capfd, parallel_from, cores,
                                                                                         files):
    """training/tokens.py: the ids and lengths are the tokenizer's own, in files of RECORD_BATCH-row record batches
    (one file a worker: a worker a core the process may use, not a core of the machine), built without a progress bar,
    whatever a killed build left; a second call (a resumed run, or another process) reuses the folder; other pairs or
    another tokenizer rebuild it, with a line that says so."""
    from training import tokens as tokens_module
    from training.tokens import token_dataset

    monkeypatch.setattr(tokens_module, "PARALLEL_FROM", parallel_from)
    monkeypatch.setattr(tokens_module, "usable_cores", lambda: cores)  # the process's (its affinity, its limit)
    (tmp_path / "tokens.partial").mkdir()  # a killed build's
    (tmp_path / "tokens.partial" / "tokens_00007_of_00008.arrow").write_bytes(b"cut short")

    pairs = generate()["train"][:300]
    tokenizer = train_joint_bpe((side for pair in pairs for side in pair), 200)
    tokenizer.backend_tokenizer.enable_padding(pad_id=tokenizer.pad_token_id)  # as a run's saved tokenizer.json asks
    tokenizer.save_pretrained(tmp_path)
    main = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    said = []
    rows = Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]})
    tokens = token_dataset(main, rows, tokenizer, tmp_path, said.append)
    assert tokens.cache_files and all(f["filename"].startswith(str(tmp_path / "tokens")) for f in tokens.cache_files)
    for row, (source, target) in zip(tokens, pairs):
        assert row["source_ids"] == tokenizer(source)["input_ids"]
        assert row["target_ids"] == tokenizer(target)["input_ids"]
        assert (row["source_length"], row["target_length"]) == (len(row["source_ids"]), len(row["target_ids"]))
    assert len(tokens) == len(pairs) and len(said) == 1  # "300 training pairs tokenized into ..."
    assert len(list((tmp_path / "tokens").glob("*.arrow"))) == files == len(tokens.data.to_batches())
    assert tokens_module.workers(len(pairs)) == (files if files > 1 else None)  # one core: no pool of one started
    assert capfd.readouterr().err == ""
    built = (tmp_path / "tokens" / "fingerprint.json").stat().st_mtime_ns
    other_process = SimpleNamespace(is_main_process=False, wait_for_everyone=lambda: None)
    assert token_dataset(other_process, rows, None, tmp_path, said.append)["source_ids"] == tokens["source_ids"]
    token_dataset(main, rows, tokenizer, tmp_path, said.append)  # resumed: the same pairs and tokenizer
    assert (tmp_path / "tokens" / "fingerprint.json").stat().st_mtime_ns == built and len(said) == 1
    fewer = token_dataset(main, rows.select(range(100)), tokenizer, tmp_path, said.append)  # in the main process
    assert len(fewer) == 100 and "tokenized from other pairs or by another tokenizer" in said[1]
    other = train_joint_bpe((side for pair in pairs for side in pair), 120)
    other.save_pretrained(tmp_path)
    again = token_dataset(main, rows.select(range(100)), other, tmp_path, said.append)
    assert "tokenizing again" in said[3] and again[0]["source_ids"] == other(pairs[0][0])["input_ids"]


def test_tokens_the_disk_cannot_hold_are_removed_and_said_in_one_line(tmp_path, monkeypatch):
    """A full disk while the training pairs are tokenized: what was written is removed (the room given back) and the
    WriteRefused names the folder and, with no checkpoint yet, says to start again."""
    from training import tokens as tokens_module
    from training.checkpoints import WriteRefused
    from training.tokens import token_dataset

    pairs = generate()["train"][:50]
    tokenizer = train_joint_bpe((side for pair in pairs for side in pair), 200)
    rows = Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]})
    encode_batch = tokens_module.encode_batch

    def full(batch, encoder):
        (tmp_path / "tokens.partial" / "written.arrow").write_bytes(b"part")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tokens_module, "encode_batch", full)
    main = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    with pytest.raises(WriteRefused) as refused:
        token_dataset(main, rows, tokenizer, tmp_path, print)
    assert str(refused.value) == (f"tokens/ could not be written in {tmp_path} ([Errno 28] No space left on device): "
                                  "no checkpoint was written yet; make room, then start again in an empty folder")
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(tokens_module, "encode_batch", encode_batch)
    assert len(token_dataset(main, rows, tokenizer, tmp_path, print)) == 50


def test_the_tokens_fingerprint_reads_every_file_of_the_tokenizer(tmp_path):
    """A converted model's tokenizer is several files (a SentencePiece model a side, a vocabulary): a change to any
    of them changes the fingerprint, which rebuilds the tokens (the test above)."""
    from training.tokens import fingerprint

    rows = Dataset.from_dict({"source": ["A dog ."], "target": ["Ein Hund ."]})
    tokenizer = SimpleNamespace(vocab_files_names={"source_spm": "source.spm", "target_spm": "target.spm",
                                                   "vocab": "vocab.json"})
    seen = set()
    for name in ("source.spm", "target.spm", "vocab.json"):
        for content in (b"1", b"2"):
            (tmp_path / name).write_bytes(content)
            seen.add(fingerprint(rows, tokenizer, tmp_path)["tokenizer"])
    assert len(seen) == 6


def test_the_embedded_data_gives_todays_tokenizer_and_lengths_through_datasets(tmp_path):
    """The pipeline on datasets (Arrow files read a thousand pairs at a time) gives what the lists gave: the same
    joint BPE, the same token lengths, so the same batches for the same seed (the batching test above); a BPE
    sample trains on that many pairs."""
    from training.batching import encode
    from training.tokenizer import corpus_texts
    from training.tokens import token_dataset

    rows = load_splits("en", "de")["train"]
    pairs = load_pairs("en", "de")["train"]
    assert len(rows) == len(pairs) == 30000 and rows[0] == {"source": pairs[0][0], "target": pairs[0][1]}
    assert list(itertools.islice(corpus_texts(rows), 4)) == [pairs[0][0], pairs[0][1], pairs[1][0], pairs[1][1]]
    listed = train_joint_bpe((side for pair in pairs for side in pair), 500)
    streamed = train_joint_bpe(corpus_texts(rows), 500)
    assert streamed.backend_tokenizer.to_str() == listed.backend_tokenizer.to_str()
    streamed.save_pretrained(tmp_path)
    tokens = token_dataset(SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None), rows, streamed,
                           tmp_path, lambda line: None)
    sources, targets = encode(listed, pairs)
    assert tokens["source_length"] == [len(s) for s in sources]
    assert tokens["target_length"] == [len(t) for t in targets]
    sample = list(corpus_texts(rows, sample=50, seed=1))
    assert len(sample) == 100 and sample != list(itertools.islice(corpus_texts(rows), 100))
    assert set(sample[::2]) <= {source for source, _ in pairs}
    assert list(corpus_texts(rows, sample=50, seed=2)) != sample  # the seed draws the sample
    stream = rows.to_iterable_dataset()
    assert list(corpus_texts(stream, sample=3)) == list(itertools.islice(corpus_texts(rows), 6))  # a stream's first
