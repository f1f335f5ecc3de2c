"""Shared by the harness's Python tests: paths and a way to run the CLI."""
import os
import subprocess
import sys

SOURCE_DIR = os.environ.get("FSDPSIM_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(SOURCE_DIR, "scripts")
CLI = os.path.join(SCRIPTS, "torch_memory_reference.py")
FIXTURE_DIR = os.path.join(SOURCE_DIR, "tests", "fixtures", "torch_memory")
sys.path.insert(0, SCRIPTS)


def run_cli(*args, env=None):
    full_env = dict(os.environ)
    full_env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, CLI, *args], capture_output=True, text=True, env=full_env)
