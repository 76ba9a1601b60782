"""The suite's settings and hooks. The helpers and fixtures the tests use are in support.py, loaded here as a plugin
by every process that runs tests, and not by pytest-xdist's controller, which hands the tests to its workers and runs
none: the imports that support.py needs (torch, transformers, vaswani_hf) would hold its workers back 8-9 s on a slow
CPU."""

import atexit
import os
import shutil
import tempfile

# The tests never reach the Hub (they build what they need): offline, a call that would is refused at once instead of
# waiting out the network's timeouts (push_to_hub's model card lookup took 24 s). Set before huggingface_hub loads.
os.environ["HF_HUB_OFFLINE"] = "1"
# What our tools keep once per machine (fast_cpu's plans, CTranslate2 exports) goes to the tests' own folder, never the
# user's ~/.cache; the processes the tests start inherit it. It is removed when this process ends.
os.environ["VASWANI_HF_CACHE"] = tempfile.mkdtemp(prefix="vaswani-hf-tests-")
atexit.register(shutil.rmtree, os.environ["VASWANI_HF_CACHE"], ignore_errors=True)


def is_xdist_controller(config) -> bool:
    return (not hasattr(config, "workerinput") and not config.getoption("collectonly")
            and config.getoption("dist", "no") != "no" and bool(config.getoption("tx", None)))


def pytest_xdist_auto_num_workers(config):
    """`--numprocesses logical` (pyproject.toml): a worker a core this process may use, as joblib counts them (its
    affinity: `taskset`, a cluster job's cpuset; a container's CPU limit), not one a core of the machine (psutil's
    count, xdist's own), which on 2 cores of a 64-core machine would start 64 workers, unpinned.
    PYTEST_XDIST_AUTO_NUM_WORKERS still decides where it is set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own answer
    import joblib  # not vaswani_hf's usable_cores: the controller imports no torch

    return joblib.cpu_count()


def pytest_configure(config):
    """Where tests run, support.py's helpers and fixtures are loaded; with pytest-xdist's `-n N` (pyproject.toml),
    worker k keeps to one core of its own, and so do the processes it starts (training/run.py shares the cores it
    may use): the workers never fight over a core."""
    if is_xdist_controller(config):
        return
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    pinned = worker and hasattr(os, "sched_setaffinity") and int(count) <= len(os.sched_getaffinity(0))
    if pinned:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[int(worker.removeprefix("gw"))]})
    config.pluginmanager.import_plugin("support")
    if pinned:
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """Tests marked `long` (training runs; groups that share an export) run first, the longest first (`minutes`, an
    estimate on one core), so that parallel workers share them out and finish together, rather than one of them
    starting minutes of work at the end. pytest-xdist hands out the work in this order (`--no-loadscope-reorder`):
    each `xdist_group` as one unit, at its first test's place (the pytest pinned in pyproject.toml is one on which
    loadgroup groups)."""

    def order(item):
        long = item.get_closest_marker("long")
        return (0, -long.kwargs.get("minutes", 1)) if long else (1, 0)

    items.sort(key=order)
