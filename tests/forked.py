"""training/run.py in processes forked from one that has already imported what it imports: a process of its own
(a kill, a signal, an exit code, a rank of a distributed run) without the 10 s or so that each interpreter spends
importing torch, transformers, datasets and Accelerate on a slow CPU.

The processes come from multiprocessing's fork server, started once per pytest worker with the environment that
the launches share (environment variables that libraries read as they are imported must be the same in every
launch; a launch's own are set before the script runs). A distributed run's ranks get the environment that
`accelerate launch` computes for its processes (Accelerate's own functions) and the variables torchrun adds; the
launcher itself is tested where a test runs the README's commands."""

import atexit
import faulthandler
import multiprocessing
import os
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
from multiprocessing.connection import wait
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "training" / "run.py"
SHARED_ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
SERVER = multiprocessing.get_context("forkserver")
SERVER.set_forkserver_preload(["training.run"])


def _script(script: str, argv: list[str], env: dict, output: str, cwd: str) -> None:
    """In the forked process: `python script *argv` in `cwd` with this environment, stdout and stderr going to
    `output`.out and .err unbuffered, faulthandler on, the interpreter's exit handlers run at the end."""
    os.chdir(cwd)
    for fd, suffix in ((1, ".out"), (2, ".err")):
        file = os.open(output + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(file, fd)
        os.close(file)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(write_through=True)
    faulthandler.enable()
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [script, *argv]
    sys.path.insert(0, str(Path(script).parent))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        atexit._run_exitfuncs()


def free_port() -> int:
    """A port no other process listens on now (the kernel's choice): runs launched side by side by pytest-xdist's
    workers do not meet on one."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def torch_ranks(world: int = 2) -> list[dict]:
    """The environment that torch.distributed's default start (env://) reads in each of `world` processes here."""
    port = str(free_port())
    return [{"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": port} for rank in range(world)]


def start_server() -> None:
    """The fork server, started with the shared environment (once; later calls find it running)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in SHARED_ENV.items():
            patch.setenv(name, value)
        multiprocessing.forkserver.ensure_running()


def run_forked(argv: list[str], envs: list[dict], timeout: float, cwd: os.PathLike | None = None,
               script: Path = RUN) -> subprocess.CompletedProcess:
    """training/run.py (or another `script`) with `argv` in one forked process per environment (a run's ranks; each
    on top of this process's), to the end of all. If one fails, the others are stopped, as torchrun stops them. A
    hang (`timeout` seconds without an end: nothing run this way needs that long) fails the test with each process's
    threads' Python stacks. Returns the exit status (the first failure's, else 0) and what the processes printed,
    rank after rank. They run in `cwd` (default: this process's working folder)."""
    start_server()
    argv = [str(arg) for arg in argv]
    with tempfile.TemporaryDirectory() as folder:
        outputs = [os.path.join(folder, str(rank)) for rank in range(len(envs))]
        cwd = os.fspath(cwd or os.getcwd())
        processes = [SERVER.Process(target=_script, args=(str(script), argv, {**os.environ, **SHARED_ENV, **env},
                                                          output, cwd)) for env, output in zip(envs, outputs)]
        for process in processes:
            process.start()
        running, failed = {process.sentinel: process for process in processes}, None
        while running and (ended := wait(list(running), timeout=timeout)):
            for sentinel in ended:
                process = running.pop(sentinel)
                process.join()
                if process.exitcode and failed is None:
                    failed = process
                    for other in running.values():
                        other.terminate()
        for process in running.values():  # a hang: each prints its stacks (faulthandler) and stops
            os.kill(process.pid, signal.SIGABRT)
        for process in processes:
            process.join()
        out, err = ("".join(Path(output + suffix).read_text(encoding="utf-8") for output in outputs)
                    for suffix in (".out", ".err"))
    if running:
        pytest.fail(f"{script.name} {' '.join(argv)} still ran after {timeout} s:\n{out}{err}")
    return subprocess.CompletedProcess([str(script), *argv], failed.exitcode if failed else 0, out, err)


def launched(launch_args: list[str]):
    """`accelerate launch *launch_args` parsed and completed as the launcher does it (Accelerate's own functions)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    return _validate_launch_command(launch_command_parser().parse_args(launch_args))[0]


def changed(environ: dict) -> dict:
    """The variables of `environ` that this process lacks or has with another value."""
    return {name: value for name, value in environ.items() if os.environ.get(name) != value}


def accelerate_ranks(processes: int, *launch_flags: str, port: int) -> list[dict]:
    """The environment of each process of `accelerate launch --num_processes N *launch_flags` on this machine: what
    the launcher hands torchrun (Accelerate's prepare_multi_gpu_env) and what torchrun adds for each rank."""
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launched(["--num_processes", str(processes), "--num_machines", "1", "--main_process_port", str(port),
                     *launch_flags, str(RUN)])
    common = changed(prepare_multi_gpu_env(args))
    return [{**common, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "WORLD_SIZE": str(processes),
             "LOCAL_WORLD_SIZE": str(processes), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            for rank in range(processes)]


def run_launch_command(launch_args: list[str], env: dict, timeout: float,
                       cwd: os.PathLike | None = None) -> subprocess.CompletedProcess:
    """`accelerate launch *launch_args` (FLAGS training/run.py ARGS) for one process, in the environment `env`, as the
    launcher runs it: run.py forked as above, with the variables that Accelerate's own
    `prepare_simple_launcher_cmd_env` sets for it (and those of `env` that differ from this process's)."""
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    args = launched(launch_args)
    assert args.num_processes <= 1 and not (args.multi_gpu or args.use_fsdp), launch_args  # the simple launcher's
    assert (Path(cwd or os.getcwd()) / args.training_script).resolve() == RUN, launch_args
    own = changed({**env, **prepare_simple_launcher_cmd_env(args)[1]})
    return run_forked(args.training_script_args, [own], timeout, cwd)
