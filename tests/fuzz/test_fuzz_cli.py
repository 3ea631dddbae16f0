"""Fuzz cases for the calculator's command line (``python -m engine.memory``).

Every bad value of every numeric flag, unknown names, contradictory flags and bad files must end
in exit status 2 with exactly one line on stderr naming the problem (``expect_cli_error``); a few
extreme-but-valid inputs must be answered (``expect_accepted``). Most cases call ``main(argv)``
in-process (fast); a handful run the real ``python -m engine.memory`` subprocess.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.sizing.cli import main
from tests.fuzz.harness import (CaseTimeout, CliResult, TALLY, expect_accepted, expect_cli_error, run_cli,
                                time_limit)

ROOT = Path(__file__).resolve().parents[2]
TEXT = ("--model", "llama-2-7b", "--hardware", "t4")
VLM = ("--model", "internvl2-8b", "--hardware", "a100-80gb")
CASE_SECONDS = 20.0


def run_main(capsys: pytest.CaptureFixture[str], args: tuple[str, ...] | list[str],
             seconds: float = CASE_SECONDS) -> CliResult:
    """``main(argv)`` in-process under a time limit, as the CliResult a subprocess would give."""
    try:
        with time_limit(seconds):
            code = main(list(args))
    except SystemExit as exc:  # --help / argparse paths that exit
        code = exc.code if isinstance(exc.code, int) else 2
    except CaseTimeout:
        TALLY.cases += 1
        TALLY.hangs += 1
        pytest.fail(f"main({list(args)}) gave no answer within {seconds} s", pytrace=False)
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


# --- every numeric flag, every kind of bad number ------------------------------------------------------
#: flag -> (base arguments, regex the message must match: the flag's name)
INT_FLAGS = {
    "--batch": (TEXT, r"batch"),
    "--context": (TEXT, r"context"),
    "--prompt": (TEXT, r"prompt"),
    "--output": (TEXT, r"output"),
    "--images": (VLM, r"images"),
    "--tiles": (VLM, r"tiles"),
    "--tp": (TEXT, r"\btp\b"),
    "--pp": (TEXT, r"\bpp\b"),
    "--block-size": (TEXT, r"block"),
    "--max-num-batched-tokens": (TEXT, r"max.num.batched.tokens"),
}
BAD_INTS = ["-1", "0", "nan", "inf", "1e30", "abc", "1.5", str(10**21)]
FLOAT_FLAGS = {
    "--util": (TEXT, r"util"),
    "--gpu-memory-utilization": (TEXT, r"util"),
    "--efficiency-memory": (TEXT, r"efficiency"),
    "--efficiency-compute": (TEXT, r"efficiency"),
}
BAD_FLOATS = ["-1", "0", "nan", "inf", "-inf", "1e30", "abc", "1.5", ""]


def _int_cases() -> list[tuple[str, str]]:
    # 0 images per sequence is a valid request (text only)
    return [(flag, v) for flag in INT_FLAGS for v in BAD_INTS if not (flag == "--images" and v == "0")]


@pytest.mark.parametrize("flag, value", _int_cases())
def test_bad_whole_numbers(capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    base, match = INT_FLAGS[flag]
    expect_cli_error(run_main(capsys, [*base, f"{flag}={value}"]), match)


@pytest.mark.parametrize("flag, value", [(f, v) for f in FLOAT_FLAGS for v in BAD_FLOATS])
def test_bad_fractions(capsys: pytest.CaptureFixture[str], flag: str, value: str) -> None:
    base, match = FLOAT_FLAGS[flag]
    expect_cli_error(run_main(capsys, [*base, f"{flag}={value}"]), match)


# --- names ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, match", [
    (("--model", "no-such-model", "--hardware", "t4"), r"unknown model"),
    (("--model", "", "--hardware", "t4"), r"model"),
    (("--model", "x" * 5000, "--hardware", "t4"), r"model"),
    (("--model", "llama-2-7b", "--hardware", "no-such-gpu"), r"unknown hardware"),
    (("--model", "llama-2-7b", "--hardware", ""), r"hardware"),
    (("--model", "llama-2-7b", "--hardware", "h" * 5000), r"hardware"),
    (("--model", "llama\x00-2", "--hardware", "t4"), r"model"),
    (("--model", "llama-2-7b", "--hardware", "./t4\x00.json"), r"hardware|t4"),
    (("--model", "../../../../etc/passwd", "--hardware", "t4"), r"model|config"),
    ((*TEXT, "--weights", "int3"), r"weight format"),
    ((*TEXT, "--weights", ""), r"weight format"),
    ((*TEXT, "--kv-dtype", "fp5"), r"KV-cache dtype"),
    ((*TEXT, "--vision-dtype", "int3"), r"weight format"),
    ((*TEXT, "--framework", "tgi"), r"unknown framework"),
    ((*TEXT, "--framework", "vllm-ascend"), r"Ascend"),
    ((*TEXT, "--framework", "vllm", "--framework-version", "seven"), r"framework_version 'seven' is not a version"),
    ((*TEXT, "--framework", "vllm", "--framework-version", "0.7" * 400), r"framework_version is too long"),
    ((*TEXT, "--framework", "vllm", "--framework-version", "0.7\x00"), r"framework_version"),
    ((*TEXT, "--framework", "none", "--framework-version", "0.7"), r"applies to vllm, sglang and vllm-ascend only"),
    ((*TEXT, "--framework", "mindie"), r"framework 'mindie' \(MindIE\) runs on Ascend NPUs only"),
    ((*TEXT, "--framework", "mindie", "--framework-version", "2.1"), r"Ascend NPUs only"),
    ((*TEXT, "--no-such-flag"), r"unrecognized"),
    ((*TEXT, "--batch"), r"batch"),
])
def test_unknown_names_and_flags(capsys: pytest.CaptureFixture[str], args: tuple[str, ...], match: str) -> None:
    expect_cli_error(run_main(capsys, args), match)


# --- contradictions ------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, match", [
    ((*TEXT, "--prompt", "9000", "--context", "4096"), r"prompt.*fewer than the context"),
    ((*TEXT, "--prompt", "4096", "--context", "4096"), r"prompt"),
    ((*TEXT, "--output", "4096", "--context", "4096"), r"output"),
    ((*TEXT, "--prompt", "100", "--output", "100", "--context", "4096"), r"give two of them"),
    ((*TEXT, "--prompt", str(2**24), "--output", "512"), r"context must be <="),
    ((*TEXT, "--images", "1"), r"no vision tower"),
    ((*VLM, "--context", "1000", "--images", "1"), r"do not fit"),
    ((*TEXT, "--tp", "3"), r"does not divide"),
    ((*TEXT, "--pp", "33"), r"layers"),
    ((*TEXT, "--tp", "128"), r"tp"),
    ((*TEXT, "--block-size", "7"), r"1, 8, 16, 32, 64, 128"),
    ((*TEXT, "--framework", "vllm", "--block-size", "256"), r"block"),
    ((*TEXT, "--framework", "sglang", "--block-size", "5000"), r"page"),
    (("--model", "qwen2.5-7b", "--hardware", "atlas-300i-duo", "--block-size", "8"), r"vllm-ascend"),
    (("--model", "llama-2-7b"), r"--hardware is required"),
    (("--hardware", "t4"), r"--model is required"),
])
def test_contradictory_flags(capsys: pytest.CaptureFixture[str], args: tuple[str, ...], match: str) -> None:
    expect_cli_error(run_main(capsys, args), match)


# --- files ---------------------------------------------------------------------------------------------
GOOD_CONFIG = {k: v for k, v in json.loads((ROOT / "presets" / "models" / "smollm2-135m.json").read_text()).items()
               if not k.startswith("_")}


def _write(path: Path, content: str | None) -> Path:
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    return path


@pytest.mark.parametrize("name, content, match", [
    ("missing.json", "MISSING", r"not found"),
    ("folder", None, r"no config\.json"),
    ("config.json", "not json", r"malformed"),
    ("config.json", "", r"empty"),
    ("config.json", "[1, 2]", r"JSON object"),
    ("config.json", "{}", r"missing"),
    ("config.json", '"text"', r"JSON object"),
    ("config.json", json.dumps({**GOOD_CONFIG, "num_hidden_layers": 0}), r"num_hidden_layers"),
    ("config.json", json.dumps({**GOOD_CONFIG, "hidden_size": "wide"}), r"hidden_size"),
    ("config.json", json.dumps({**GOOD_CONFIG, "num_attention_heads": -4}), r"num_attention_heads"),
])
def test_bad_model_files(capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, content: str | None,
                         match: str) -> None:
    path = tmp_path / name if content == "MISSING" else _write(tmp_path / name, content)
    expect_cli_error(run_main(capsys, ["--model", str(path), "--hardware", "t4"]), match)


@pytest.mark.parametrize("name, content, match", [
    ("missing.json", "MISSING", r"not found"),
    ("folder", None, r"hardware"),
    ("hw.json", "not json", r"not valid JSON"),
    ("hw.json", "[1]", r"JSON object"),
])
def test_bad_hardware_files(capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, content: str | None,
                            match: str) -> None:
    path = tmp_path / name if content == "MISSING" else _write(tmp_path / name, content)
    expect_cli_error(run_main(capsys, ["--model", "llama-2-7b", "--hardware", str(path)]), match)


# --- documented acceptances (extreme but valid) --------------------------------------------------------
@pytest.mark.parametrize("args", [
    (*TEXT, "--context", "8192"),  # beyond the model's limit: a warning, not a refusal
    (*TEXT, "--context", str(2**24)),  # the documented maximum itself
    (*TEXT, "--batch", str(2**20)),
    (*TEXT, "--block-size", "128"),
    (*VLM, "--images", "0"),
    (*TEXT, "--util", "1"),
])
def test_extreme_but_valid_inputs_are_answered(capsys: pytest.CaptureFixture[str], args: tuple[str, ...]) -> None:
    result = expect_accepted(lambda: run_main(capsys, [*args, "--json"]))
    assert result.returncode == 0, result.stderr
    d = json.loads(result.stdout)
    assert d["total_bytes_per_device"] > 0 and isinstance(d["fits"], bool)


# --- the real command, as a user runs it --------------------------------------------------------------
@pytest.mark.parametrize("args, match", [
    ((*TEXT, "--prompt", "9000", "--context", "4096"), r"prompt"),
    ((*TEXT, "--context", str(10**21)), r"context"),
    ((*TEXT, "--block-size", "7"), r"block"),
    ((*TEXT, "--util", "nan"), r"util"),
    (("--model", "/nonexistent/config.json", "--hardware", "t4"), r"not found"),
])
def test_real_subprocess(args: tuple[str, ...], match: str) -> None:
    expect_cli_error(run_cli("engine.memory", list(args)), match)


def test_calculator_imports_no_torch() -> None:
    """The CLI's speed rests on never importing torch (measured in docs/benchmarks.md: startup + answer)."""
    code = ("import sys, engine.memory, engine.sizing; "
            "print(sorted(m for m in ('torch', 'transformers', 'streamlit') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("flag", ["--weights", "--kv-dtype", "--vision-dtype", "--framework"])
def test_empty_names_are_not_auto(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    """An empty value was silently taken as "auto"."""
    expect_cli_error(run_main(capsys, [*TEXT, f"{flag}="]), r"unknown")
