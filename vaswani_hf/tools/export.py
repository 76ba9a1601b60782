"""`vaswani-export`: a trained model for the engines translation models are deployed with.

    vaswani-export ctranslate2 outputs/run ct2-model --quantization int8   # to_ctranslate2.py
    vaswani-export onnx outputs/run onnx-model                              # to_onnx.py; onnx_runtime.py decodes
    vaswani-export marian outputs/run marian-model                          # to_marian.py: a MarianMTModel folder

MODEL is a model folder or a Hub repository id. The output folder must not exist; it is written under a temporary
name beside it and renamed when complete, so a failed or killed export leaves no half-written model under its name.
The engines are optional dependencies: `pip install "vaswani_hf[export]"` (Marian's is transformers').
"""

import argparse
import contextlib
import importlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from transformers.utils.logging import disable_progress_bar

from .loading import first_line, load
from .text import utf8_output

# CTranslate2's weight types (ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES).
CTRANSLATE2_QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16",
                             "float32")
ENGINE_PACKAGES = {"ctranslate2": ("ctranslate2",), "onnx": ("onnx", "onnxscript"), "marian": ()}


def check_packages(engine: str) -> None:
    missing = []
    for name in ENGINE_PACKAGES[engine]:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise SystemExit(f"error: vaswani-export {engine} needs {', '.join(missing)}: "
                         f"pip install {' '.join(missing)} (or pip install \"vaswani_hf[export]\")")


def check_output_place(output: str | Path, flag: str | None = None) -> None:
    """A one-line SystemExit where the folder `output` could not be made: blank (not the current folder, as
    Path("") would be), under a file, or in a folder not writable. `flag`: the option that gave it, if any."""
    label = f"{flag} {output}" if flag else str(output)
    if not str(output).strip():
        raise SystemExit(f"error: {flag or 'the output folder'} is blank: give a folder")
    output = Path(output)
    existing = next(path for path in (output, *output.parents) if path.exists())  # it, or the folder it goes in
    if not existing.is_dir():
        raise SystemExit(f"error: {label}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SystemExit(f"error: {label}: {existing} is not writable")


@contextlib.contextmanager
def written_whole(output: str | Path) -> Iterator[Path]:
    """A folder to fill, renamed to `output` when the block ends without error: under its name there is a whole
    folder or none. The temporary folder beside it is removed either way (only a killed process leaves it); an
    OSError while it is written (a full disk, a quota) is a one-line SystemExit."""
    named = output
    output = Path(output).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".partial", dir=output.parent)) / "model"
    try:
        yield partial
        os.replace(partial, output)
    except OSError as error:
        raise SystemExit(f"error: {named} could not be written ({first_line(error)}); nothing of it is left") from None
    finally:
        shutil.rmtree(partial.parent)


def main(argv: list[str] | None = None) -> None:
    utf8_output()
    parser = argparse.ArgumentParser(prog="vaswani-export", description="Export a vaswani_hf model to another engine.")
    engines = parser.add_subparsers(dest="engine", required=True)
    ct2 = engines.add_parser("ctranslate2", help="a CTranslate2 model folder (model.bin, vocabulary, tokenizer)")
    ct2.add_argument("--quantization", choices=CTRANSLATE2_QUANTIZATIONS,
                     help="weight type (default: float32); int8 weights keep to 7 bits, see to_ctranslate2.py")
    onnx = engines.add_parser("onnx", help="ONNX graphs: encoder, decoder, decoder with past (and config, tokenizer)")
    marian = engines.add_parser("marian", help="a MarianMTModel folder: the same network in Marian's layout, for "
                                "the tools that run Marian models (optimum, transformers.js, ...)")
    for engine in (ct2, onnx, marian):
        engine.add_argument("model", help="a model folder or Hub repository id")
        engine.add_argument("output", help="the folder to write (must not exist)")
    args = parser.parse_args(argv)

    check_output_place(args.output)
    if Path(args.output).exists():
        raise SystemExit(f"error: {args.output} exists: give a folder that does not")
    check_packages(args.engine)
    disable_progress_bar()
    model, tokenizer = load(args.model, device="cpu", fast=False)  # the model files' own layers, no transform

    if args.engine == "ctranslate2":
        from ..exports.to_ctranslate2 import export

        options = {"quantization": args.quantization}
        usage = f"ctranslate2.Translator({args.output!r}), tokenizer beside it"
    elif args.engine == "onnx":
        from ..exports.to_onnx import export

        options = {}
        usage = f"vaswani_hf.exports.onnx_runtime.OnnxSeq2Seq({args.output!r}) decodes with it"
    else:
        from ..exports.to_marian import export

        options = {}
        usage = f"MarianMTModel.from_pretrained({args.output!r}), tokenizer beside it (beam search: log P / |Y|^α)"
    try:
        with written_whole(args.output) as partial:
            export(model, tokenizer, partial, **options)
    except ValueError as error:  # a model the engine cannot hold: to_ctranslate2.py's, to_marian.py's checks
        raise SystemExit(f"error: {error}") from None
    print(f"wrote {args.output}: {usage}")


if __name__ == "__main__":
    main()
