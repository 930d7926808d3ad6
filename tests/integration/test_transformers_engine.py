"""The transformers engine on the real SmolLM2-135M-Instruct (its GGUF dequantized once into a checkpoint), through
the first GPU run's script (bench/gpu_smoke.py) on its CPU parts: against the llama.cpp engine on the same lines
(statuses, key sets, prompt tokens equal to the chat template's count as the validator counts it, finish reasons,
greedy and seeded repeats, n, stop strings, content parts, completions and responses, an over-long prompt), a
cancelled line freeing the engine, and unloading. It runs with transformers' continuous batching on (the GPU
default), so both of the engine's paths run: seeded lines go through its micro-batches."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).parents[2]


@pytest.mark.timeout(600)
def test_the_gpu_smoke_script_finds_no_mismatch_between_transformers_and_llama_cpp(tmp_path: Path) -> None:
    """No mismatch, the GPU-only checks skipped (the GGUF is converted once per machine, into its model cache)."""
    report = tmp_path / "smoke.json"
    ran = subprocess.run([sys.executable, "-m", "bench.gpu_smoke", "--engines", "transformers",
                          "--continuous-batching", "on", "--report", str(report)],
                         capture_output=True, text=True, timeout=600, cwd=CHECKOUT)
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-2000:]
    found = json.loads(report.read_text())
    assert found["mismatches"] == 0
    [engine] = found["engines"]
    outcomes = {check["name"]: check["ok"] for check in engine["checks"]}
    assert outcomes["load"] is True and outcomes["responses: keys and types"] is True
    assert outcomes["an over-long prompt is 400 context_too_long"] is True
    assert outcomes["a cancelled line frees the engine"] is True
    assert engine["batching"] == "continuous"
    assert outcomes["a short line ends while a long one runs"] is True
    assert outcomes["nothing is left in flight after a cancel"] is True
    assert sum(ok is True for ok in outcomes.values()) >= 40
    gpu_only = [outcomes["the GPU goes idle after a cancel"], outcomes["GPU memory returns after unload"]]
    assert gpu_only == [None, None] or all(gpu_only)
