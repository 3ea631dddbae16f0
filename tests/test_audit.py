"""The optimisation audit (issue #23): the knowledge table, worked cases, the CLI and the measured
ablation of this engine (engine/audit/)."""
from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from engine.audit.__main__ import main, report_json
from engine.audit.audit import AuditReport, CheckItem, run_audit
from engine.audit.knowledge import PRESET, knowledge, parse_knowledge, parse_version
from engine.audit.readers import read_evidence
from engine.audit.this_engine import ENGINE_ONLY, VARIANTS, ablation, standard_workload

LOGS = Path(__file__).parent / "data" / "audit_logs"
ROOT = Path(__file__).resolve().parents[1]


def _log(name: str):  # type: ignore[no-untyped-def]
    return read_evidence((LOGS / f"{name}.txt").read_text())


def _item(r: AuditReport, name: str) -> CheckItem:
    return next(i for i in r.checklist if i.name == name)


def _recommended(r: AuditReport) -> list[str]:
    return [x.name for x in r.recommendations]


# -- the knowledge table ------------------------------------------------------------------------

def test_every_entry_has_a_source_and_every_flag_exists_in_its_version() -> None:
    kn = knowledge()
    assert len(kn.optimisations) >= 20
    for opt in kn.optimisations:
        assert opt.source.url, opt.name
        for fw, rows in opt.support.items():
            assert fw in kn.frameworks, (opt.name, fw)
            for row in rows:
                assert row.source.url and row.source.version, (opt.name, fw, row.versions)
                covered = [v for v in kn.frameworks[fw].values() if row.covers(v.parsed)]
                assert covered, (opt.name, fw, row.versions, "covers no known version")
                for v in covered:
                    if not v.args:  # this project's own engine: its knobs, not CLI flags
                        continue
                    for flag in (row.flag, row.off_flag):
                        assert flag is None or flag in v.args, (opt.name, fw, v.version, flag)
    for fw, versions in kn.frameworks.items():
        for v in versions.values():
            assert fw == "inferscope" or v.args_source is not None, (fw, v.version)


def test_support_rows_of_one_framework_never_overlap() -> None:
    kn = knowledge()
    for opt in kn.optimisations:
        for fw, rows in opt.support.items():
            for v in kn.frameworks[fw].values():
                assert sum(r.covers(v.parsed) for r in rows) <= 1, (opt.name, fw, v.version)


def test_a_malformed_table_names_the_entry() -> None:
    data = json.loads(PRESET.read_text())
    bad = copy.deepcopy(data)
    bad["optimisations"][0]["support"]["vllm"][0]["source"] = {"url": "not a url"}
    with pytest.raises(ValueError, match="continuous_batching, vllm"):
        parse_knowledge(bad)
    bad = copy.deepcopy(data)
    bad["optimisations"][1]["support"]["vllm"][0]["versions"] = ">=banana"
    with pytest.raises(ValueError, match="PEP 440"):
        parse_knowledge(bad)
    with pytest.raises(ValueError, match="malformed"):
        parse_knowledge({"frameworks": {}})


def test_versions_resolve_to_the_nearest_known_with_a_warning() -> None:
    kn = knowledge()
    fv, warn = kn.resolve("vllm", "0.6.3")
    assert fv is not None and fv.version == "0.6.3" and warn == ""
    fv, warn = kn.resolve("vllm", "0.6.4.post1")
    assert fv is not None and fv.version == "0.6.3" and "nearest" in warn
    fv, warn = kn.resolve("vllm", "0.1.0")
    assert fv is not None and fv.version == "0.5.5" and "nearest" in warn
    fv, warn = kn.resolve("vllm", "not-a-version")
    assert fv is not None and "not a version" in warn
    assert parse_version("b4589") == parse_version("4589")


# -- worked cases ----------------------------------------------------------------------------------

def test_atlas_300v_pro_internvl2_with_vllm_ascend() -> None:
    """The question the project started from: InternVL2-8B on an Atlas 300V Pro (310P)."""
    r = run_audit("internvl2-8b", "atlas-300v-pro", "vllm-ascend", "0.11.0", simulate_gains=False)
    graphs = _item(r, "cuda_graphs")
    assert graphs.status == "unsupported" and "eager" in graphs.supported_why
    assert r.detected["cuda_graphs"].source == "default" and r.detected["cuda_graphs"].value is False
    fp8 = _item(r, "weight_quant_fp8")
    assert fp8.status == "unsupported" and "no FP8" in fp8.supported_why
    kv = _item(r, "kv_cache_quant")
    assert kv.status == "unsupported" and "no FP8" in kv.supported_why
    w8 = _item(r, "weight_quant_w8a8")
    assert w8.status == "off" and w8.how == "--quantization ascend" and (w8.gain_ratio or 0) > 1.2
    assert "weight_quant_w8a8" in _recommended(r)
    cannot = {t for t, _ in r.cannot}
    assert not cannot & {x.title for x in r.recommendations}
    assert r.roofline is not None and r.roofline.decode_bound_tokens_per_s == pytest.approx(12.8, rel=0.05)


def test_atlas_300v_pro_internvl2_with_mindie() -> None:
    r = run_audit("internvl2-8b", "atlas-300v-pro", "mindie", simulate_gains=False)
    assert any("newest known" in w for w in r.warnings)
    prefix = _item(r, "prefix_caching")
    assert prefix.status == "off" and prefix.evidence.startswith("default")
    assert "plugin_params" in prefix.how and "prefix_caching" in _recommended(r)
    assert _item(r, "weight_quant_fp8").status == "unsupported"


def test_h100_vllm_v1_log_with_prefix_caching_off_and_bf16_kv() -> None:
    """A V1 server started with --no-enable-prefix-caching, KV left at auto (BF16) on an FP8-capable
    H100, and its benchmark block: both are found, priced and ranked."""
    ev = _log("bench-03")
    r = run_audit("llama-3.1-8b", "h100-sxm", "vllm", "0.10.2", evidence=ev, batch=8, context=2048,
                  simulate_gains=False)
    prefix = _item(r, "prefix_caching")
    assert prefix.status == "off" and prefix.evidence.startswith("log line 1")
    assert prefix.how == "--enable-prefix-caching"
    kv = _item(r, "kv_cache_quant")
    assert kv.status == "off" and kv.how == "--kv-cache-dtype fp8" and (kv.gain_ratio or 0) > 1.8
    assert r.detected["enable_chunked_prefill"].source == "default" and _item(r, "chunked_prefill").status == "on"
    recs = _recommended(r)
    assert "kv_cache_quant" in recs and "prefix_caching" in recs
    assert recs.index("kv_cache_quant") < recs.index("prefix_caching")  # a predicted number ranks first
    rl = r.roofline
    assert rl is not None and rl.decode_measured_tokens_per_s == pytest.approx(1000 / 33.15, rel=1e-3)
    assert rl.bandwidth_utilisation is not None and 0 < rl.bandwidth_utilisation < 1


def test_unstated_settings_take_the_versions_documented_default_marked_as_such() -> None:
    r = run_audit("llama-3.1-8b", "h100-sxm", "vllm", "0.6.3", evidence=_log("v0-02"), simulate_gains=False)
    assert r.detected["gpu_memory_utilization"].value == 0.9 and r.detected["max_num_seqs"].value == 256
    assert all(r.detected[n].source == "default" and "v0.6.3" in r.detected[n].line
               for n in ("gpu_memory_utilization", "max_num_seqs", "kv_cache_dtype", "enable_prefix_caching"))
    assert r.detected["max_model_len"].source == "log"  # stated wins
    assert _item(r, "kv_cache_quant").evidence.startswith("default: kv_cache_dtype")


def test_vllm_v0_log_on_a100() -> None:
    r = run_audit("llama-3.1-8b", "a100-80gb", "vllm", evidence=_log("v0-02"), simulate_gains=False)
    assert r.version == "0.6.3" and any("0.6.4.post1" in w for w in r.warnings)
    assert _item(r, "prefix_caching").status == "off"  # V0's default
    assert _item(r, "chunked_prefill").evidence.startswith("log line")
    fp8 = _item(r, "weight_quant_fp8")
    assert fp8.status == "unsupported" and "sm80" in fp8.supported_why
    assert "weight_quant_fp8" not in _recommended(r) and "prefix_caching" in _recommended(r)


def test_llama_cpp_log_states_kernels_and_kv_and_a_mismatched_model_is_said() -> None:
    r = run_audit("mistral-7b", "rtx-4090", "llama.cpp", evidence=_log("lcpp-04"), simulate_gains=False)
    assert _item(r, "flash_attention").status == "on"
    assert _item(r, "kv_cache_quant").status == "on"
    assert any("Devstral" in w for w in r.warnings)  # the log serves another model


def test_sglang_log_with_the_radix_cache_disabled() -> None:
    r = run_audit("llama-3.1-8b", "h100-sxm", "sglang", "0.4.6", evidence=_log("sgl-06"), simulate_gains=False)
    prefix = _item(r, "prefix_caching")
    assert prefix.status == "off" and prefix.how == "remove --disable-radix-cache"
    assert "prefix_caching" in _recommended(r)


def test_a_log_of_another_framework_is_said() -> None:
    r = run_audit("llama-3.1-8b", "h100-sxm", "vllm", evidence=_log("sgl-06"), simulate_gains=False)
    assert any("sglang log" in w for w in r.warnings)


def test_a_log_from_other_hardware_is_said() -> None:
    on_npu = run_audit("qwen3-8b", "h100-sxm", "vllm-ascend", evidence=_log("ascend-02"), simulate_gains=False)
    assert any("Ascend NPU" in w and "H100" in w for w in on_npu.warnings)
    assert not any("runs on" in w for w in run_audit("qwen3-8b", "atlas-800i-a2", "vllm-ascend",
                                                     evidence=_log("ascend-02"), simulate_gains=False).warnings)
    gpu = run_audit("mistral-7b", "rtx-3090", "llama.cpp", evidence=_log("lcpp-04"), simulate_gains=False)
    assert any("RTX 4070 SUPER" in w for w in gpu.warnings)
    same = run_audit("mistral-7b", "rtx-3090", "llama.cpp", evidence=_log("lcpp-05"), simulate_gains=False)
    assert not any("runs on" in w for w in same.warnings)


def test_simulated_gains_price_prefix_caching_and_chunked_prefill() -> None:
    r = run_audit("llama-3.1-8b", "h100-sxm", "vllm", "0.6.3", simulate_gains=True)
    prefix = _item(r, "prefix_caching")
    assert prefix.status == "off" and "simulated" in prefix.expected_gain and (prefix.gain_ratio or 0) > 1


@pytest.mark.parametrize("kw, field", [
    ({"framework": "nope"}, "framework"), ({"batch": 0}, "batch"), ({"context": -1}, "context"),
    ({"measured_decode_tok_s": float("nan")}, "measured_decode_tok_s"), ({"settings": {"bogus": 1}}, "setting"),
])
def test_bad_input_names_the_field(kw: dict, field: str) -> None:  # type: ignore[type-arg]
    args = {"model": "llama-3.1-8b", "hardware": "h100-sxm", "framework": "vllm", **kw}
    with pytest.raises(ValueError, match=field):
        run_audit(**args)


# -- the CLI ------------------------------------------------------------------------------------

def test_cli_json_has_the_issue_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--framework", "vllm", "--log",
                 str(LOGS / "v1-01.txt"), "--set", "max_num_seqs=64", "--no-simulate", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"detected", "checklist", "roofline", "recommendations"} <= set(out)
    assert out["detected"]["version"] == {"value": "0.11.0", "source": "log",
                                          "line": out["detected"]["version"]["line"]}
    assert out["detected"]["max_num_seqs"]["source"] == "setting"
    assert {"name", "applies", "supported", "enabled", "evidence", "expected_gain", "how"} <= set(out["checklist"][0])


def test_cli_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """One real process (what a user runs: the exit status and stderr as the shell sees them), the
    other bad inputs through the same ``main`` in this process (a process costs ~5 s of imports)."""
    p = subprocess.run([sys.executable, "-m", "engine.audit", "--model", "nope", "--hardware", "h100-sxm",
                        "--framework", "vllm"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "Traceback" not in p.stderr
    for argv in (["--model", "llama-3.1-8b", "--hardware", "h100-sxm"],
                 ["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--framework", "vllm", "--log", "/no/such"],
                 ["--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--framework", "vllm", "--set", "x"]):
        code = main(argv)
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (argv, err)
        assert "Traceback" not in err


def test_report_json_round_trips_through_json() -> None:
    r = run_audit("qwen3-8b", "l4", "sglang", evidence=_log("sgl-01"), simulate_gains=False)
    assert json.loads(json.dumps(report_json(r), default=str))["framework"] == "sglang"


# -- this engine, measured ------------------------------------------------------------------------

def test_this_engine_ablation_runs_every_variant_for_real() -> None:
    a = ablation("tiny-random", standard_workload(num_requests=4, prompt=48, output=6, prefix=16))
    assert [r.name for r in a.rows] == [v.name for v in VARIANTS]
    for r in (a.baseline, *(x.figures for x in a.rows)):
        assert r.makespan_s > 0 and math.isfinite(r.output_tokens_per_s) and r.output_tokens_per_s > 0
    assert all(x.speedup > 0 for x in a.rows)
    names = {o.name for o in knowledge().optimisations}
    assert {v.name for v in VARIANTS} - ENGINE_ONLY <= names  # the ablation speaks the table's names
