"""benchmarks/gpu_session.sh, the one prepared call of a scarce GPU machine: each part starts the benchmark its header
names, with flags that benchmark's own parser takes; a part the call has no time left for is skipped; an unknown
part is refused before anything runs; every part's log comes back in one archive. The benchmarks are stand-ins here
(a `python3` that records its command line): they run at tiny sizes in their own tests."""

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check
import gpu_decoding
import speed
import utilisation

STAND_IN = f"""#!{sys.executable}
import json, os, sys
if sys.argv[1] == "-c":  # the script's own look-up of cuBLAS: none here
    sys.exit(0)
with open(os.environ["RECORD"], "a") as record:
    record.write(json.dumps({{"argv": sys.argv[1:], "wrapper": os.environ.get("TORCHINDUCTOR_CPP_WRAPPER"),
                             "logs": os.environ.get("TORCH_LOGS")}}) + "\\n")
print("ran", *sys.argv[1:])
if os.environ.get("GATE"):  # a part that waits until the test opens its gate
    import time
    while not os.path.exists(os.environ["GATE"]):
        time.sleep(0.05)
"""


def session_env(tmp_path, seconds=580) -> dict:
    """The environment of a dry run in `tmp_path` whose benchmarks are the stand-in, recording into record.jsonl."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "python3").write_text(STAND_IN, encoding="utf-8")
    (bin_dir / "python3").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RECORD": str(tmp_path / "record.jsonl"),
            "OUT": str(tmp_path / "out"), "GPU_SESSION_TINY": "1", "GPU_SESSION_SECONDS": str(seconds)}


def session(tmp_path, *parts, seconds=580) -> tuple[subprocess.CompletedProcess, list[dict]]:
    result = subprocess.run(["bash", str(SCRIPT), *parts], env=session_env(tmp_path, seconds), check=False,
                            capture_output=True, text=True, timeout=60)
    record = tmp_path / "record.jsonl"
    return result, [json.loads(line) for line in record.read_bytes().splitlines()] if record.exists() else []


def archived_logs(tmp_path) -> set[str]:
    with tarfile.open(tmp_path / "out" / "gpu_session.tgz") as archive:
        return {Path(name).name for name in archive.getnames() if name.endswith(".log")}


def parsed(monkeypatch, script: str, argv: list[str]) -> argparse.Namespace:
    """The command line as the script's own parser reads it (its main() stopped there)."""

    class Parsed(Exception):
        pass

    parse = argparse.ArgumentParser.parse_args

    def stop_after_parsing(self, args=None, namespace=None):
        raise Parsed(parse(self, args))

    module = {"speed": speed, "utilisation": utilisation, "gpu_check": gpu_check, "gpu_decoding": gpu_decoding}[script]
    with monkeypatch.context() as patch, pytest.raises(Parsed) as stopped:
        patch.setattr(argparse.ArgumentParser, "parse_args", stop_after_parsing)
        patch.setattr(sys, "argv", [script, *argv])
        module.main(*([] if script == "speed" else [argv]))
    return stopped.value.args[0]


def test_each_part_runs_its_benchmark_with_flags_the_benchmark_takes(tmp_path, monkeypatch):
    parts = ["speed", "base", "wrapper", "big", "training", "eager", "cudnn", "decoding", "fp16", "deterministic"]
    result, commands = session(tmp_path, " ".join(parts[:4]), *parts[4:])  # a part may be one word or several
    assert result.returncode == 0, result.stderr
    runs = {}
    for command in commands:
        script = Path(command["argv"][0]).stem
        args = parsed(monkeypatch, script, command["argv"][1:])
        name = Path(args.output_dir).name if script != "speed" else "speed"
        runs[name] = (script, args, command)
    assert sorted(runs) == sorted(["speed", "base", "wrapper", "big", "training", "eager", "cudnn", "decoding",
                                   "fp16", "deterministic-step", "deterministic"])
    assert runs["speed"][1].sizes == ["small"] and runs["speed"][1].repeats == 1  # the dry run's sizes
    settings = {name: (args.sizes, args.processes, args.compile, args.cudnn_attention, args.skip_marian,
                       args.deterministic) for name, (script, args, _) in runs.items() if script == "utilisation"}
    assert settings == {"base": (["base"], 3, "auto", False, False, False),
                        "wrapper": (["base"], 1, "inductor", False, True, False),
                        "big": (["big"], 1, "auto", False, False, False),
                        "eager": (["base"], 1, "no", False, False, False),
                        "cudnn": (["base"], 1, "no", True, False, False),
                        "deterministic-step": (["base"], 1, "auto", False, True, True)}
    assert all(args.tiny for name, (_, args, _) in runs.items() if name != "speed")
    assert [name for name, (_, _, command) in runs.items() if command["wrapper"] == "1"] == ["wrapper"]
    assert runs["training"][1].parts == ["training", "remote"] and runs["training"][2]["logs"] == "recompiles"
    assert runs["deterministic"][1].parts == ["training"] and runs["deterministic"][1].deterministic
    assert runs["fp16"][1].parts == ["training"] and runs["fp16"][1].mixed_precision == "fp16"
    assert [name for name, (_, args, _) in runs.items() if getattr(args, "mixed_precision", None)] == ["fp16"]
    assert {f"{name}.log" for name in runs if name != "speed"} <= archived_logs(tmp_path)
    assert (tmp_path / "out" / "speed.log").read_text(encoding="utf-8").startswith("ran ")


def test_a_part_without_the_time_it_needs_is_skipped(tmp_path):
    result, commands = session(tmp_path, "eager", "base", "cudnn", seconds=100)  # base needs 240 s
    assert result.returncode == 0 and "gpu_session: base skipped" in result.stdout
    output_dirs = [command["argv"][command["argv"].index("--output_dir") + 1] for command in commands]
    assert [Path(folder).name for folder in output_dirs] == ["eager", "cudnn"]


def test_two_sessions_at_once_each_archive_their_own_parts_logs(tmp_path):
    """One session waits in its first part while another starts and ends on the same machine (as two of the suite's
    dry runs may): each archives the logs of its own parts, every one of them."""
    first, second = tmp_path / "first", tmp_path / "second"
    env = {**session_env(first), "GATE": str(tmp_path / "gate")}
    waiting = subprocess.Popen(["bash", str(SCRIPT), "eager", "cudnn"], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        while not (first / "record.jsonl").exists():  # in its first part
            assert waiting.poll() is None
            time.sleep(0.05)
        result, _ = session(second, "decoding")
        assert result.returncode == 0
    finally:
        (tmp_path / "gate").touch()
        assert waiting.wait(timeout=60) == 0
    assert archived_logs(first) == {"eager.log", "cudnn.log"} and archived_logs(second) == {"decoding.log"}


def test_an_unknown_part_is_refused_before_anything_runs(tmp_path):
    result, commands = session(tmp_path, "eager", "decoding basee")
    assert result.returncode == 1 and commands == []
    assert result.stdout.startswith("error: unknown part basee: speed, base, ")
