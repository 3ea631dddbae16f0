"""``python -m engine.memory`` — the calculator's command line (a stable contract).

    python -m engine.memory --model NAME_OR_CONFIG_PATH --hardware NAME [--weights FORMAT]
        [--kv-dtype DTYPE] [--batch N] [--context TOKENS] [--tp N] [--pp N]
        [--framework none|vllm|sglang|vllm-ascend|mindie] [--framework-version 0.7|0.10.1|...] [--json]
    python -m engine.memory --list-models | --list-hardware

A bad value exits with status 2 and one line on stderr; never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys

from typing import Any, NoReturn

from .budget import (ASCEND_BLOCK_SIZES, FRAMEWORK_LABELS, MAX_BATCHED_TOKENS, SGLANG_MAX_PAGE,
                     VLLM_BLOCK_SIZES)
from .estimate import Estimate, estimate
from .formats import KV_DTYPES, WEIGHT_FORMATS, SizingError
from .hardware import get_hardware, hardware_presets, preset_info
from .models import MAX_NAME_CHARS, get_model, model_preset_config, model_presets
from .plan import Settings, Workload
from .units import GiB, gib, rate
from .workload import MAX_BATCH, MAX_CONTEXT

JSON_KEYS = ("params_total", "params_active", "weight_bytes", "kv_bytes_per_token", "kv_bytes", "activation_bytes",
             "overhead_bytes", "total_bytes_per_device", "device_memory_bytes", "fits", "devices_needed",
             "max_context", "max_batch", "prefill_seconds", "decode_tokens_per_s", "bound")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        raise SizingError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m engine.memory", add_help=True,
                description="Does model X fit on device Y, and how fast? (InferScope hardware-fit calculator)")
    p.add_argument("--model", help="preset name (see --list-models), a config.json path, or a local model folder")
    p.add_argument("--hardware", help="preset name (see --list-hardware) or a hardware JSON file")
    p.add_argument("--weights", default="auto", help=f"weight format: auto, {', '.join(WEIGHT_FORMATS)}")
    p.add_argument("--kv-dtype", default="auto", help=f"KV-cache dtype: auto, {', '.join(KV_DTYPES)}")
    p.add_argument("--vision-dtype", default="auto", help="vision tower precision (vision-language models)")
    p.add_argument("--batch", type=int, default=1, help=f"concurrent sequences (default 1, at most {MAX_BATCH:,})")
    p.add_argument("--context", type=int, help="tokens per sequence: prompt + image tokens + output (default 4096,"
                                               f" at most {MAX_CONTEXT:,})")
    p.add_argument("--prompt", type=int, help="text tokens in the prompt")
    p.add_argument("--output", type=int, help="generated tokens (default 512); prompt and output < context")
    p.add_argument("--images", type=int, help="images per sequence (VLMs; default 1)")
    p.add_argument("--tiles", type=int, help="tiles per image (InternVL: 256 tokens each; default 12 + thumbnail)")
    p.add_argument("--tp", type=int, help="tensor-parallel size (default: chips per card)")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    p.add_argument("--framework", default="auto", help="none | vllm | sglang | vllm-ascend | mindie (Ascend only) (default: by hardware)")
    p.add_argument("--framework-version", help="vllm / sglang version whose budget rule to apply, e.g. 0.7 (vLLM V0),"
                                               " 0.10.1 (V1), 0.4.3 (SGLang); default: vLLM >= 0.21, SGLang 0.4")
    p.add_argument("--gpu-memory-utilization", "--util", type=float, dest="util",
                   help="vLLM gpu_memory_utilization / SGLang mem_fraction_static")
    p.add_argument("--block-size", type=int, help="KV block size (default 16 on GPUs, 128 on Ascend): vLLM takes"
                                                  f" {', '.join(map(str, VLLM_BLOCK_SIZES))}; vllm-ascend"
                                                  f" {', '.join(map(str, ASCEND_BLOCK_SIZES))}; SGLang's page size"
                                                  f" 1..{SGLANG_MAX_PAGE}")
    p.add_argument("--max-num-batched-tokens", type=int,
                   help=f"token budget per step (activation profile; at most {MAX_BATCHED_TOKENS:,})")
    p.add_argument("--efficiency-memory", type=float, help="fraction of peak bandwidth reached (default by device class)")
    p.add_argument("--efficiency-compute", type=float, help="fraction of peak compute reached (default by device class)")
    p.add_argument("--formula", action="store_true", help="also print every formula with its numbers")
    p.add_argument("--json", action="store_true", help="print one JSON object (sizes in bytes)")
    p.add_argument("--list-models", action="store_true", help="list model presets")
    p.add_argument("--list-hardware", action="store_true", help="list hardware presets")
    return p


def _list_models(as_json: bool) -> str:
    rows: list[dict[str, Any]] = []
    for key in model_presets():
        cfg = model_preset_config(key)
        src = cfg.get("_source", {})
        spec = get_model(key)
        rows.append({"name": key, "display_name": src.get("display_name", key), "hf_id": src.get("hf_id"),
                     "params_total": spec.params_total, "params_active": spec.params_active, "family": spec.family})
    if as_json:
        return json.dumps(rows, indent=2)
    width = max(len(r["name"]) for r in rows)
    return "\n".join(f"{r['name']:<{width}}  {r['params_total'] / 1e9:8.2f} B  {r['family']}" for r in rows)


def _list_hardware(as_json: bool) -> str:
    rows: list[dict[str, Any]] = []
    for key in hardware_presets():
        info = preset_info(key)
        if info.measured:
            rows.append({"name": key, "display_name": info.name, "memory_gib": None, "bandwidth_gb_s": None,
                         "fp16_tflops": None, "devices_per_card": 1, "note": "measured when selected"})
            continue
        hw = get_hardware(key)
        rows.append({"name": key, "display_name": info.name, "memory_gib": round(hw.memory_bytes / GiB, 2),
                     "bandwidth_gb_s": hw.bandwidth / 1e9, "fp16_tflops": hw.fp16_flops / 1e12,
                     "devices_per_card": hw.devices_per_card, "note": ""})
    if as_json:
        return json.dumps(rows, indent=2)
    width = max(len(r["name"]) for r in rows)
    out = []
    for r in rows:
        if r["memory_gib"] is None:
            out.append(f"{r['name']:<{width}}  (measured when selected: memory, copy bandwidth, matmul rate)")
        else:
            per = f" x{r['devices_per_card']} chips" if r["devices_per_card"] > 1 else ""
            out.append(f"{r['name']:<{width}}  {r['memory_gib']:7.1f} GiB{per:10}  {r['bandwidth_gb_s']:7.1f} GB/s"
                       f"  {r['fp16_tflops']:6.1f} TFLOPS FP16  {r['display_name']}")
    return "\n".join(out)


def _speed_lines(e: Estimate) -> list[str]:
    """Speed on the devices asked for, only where it fits there; otherwise a line saying it is not
    quoted, and the speed on the fewest devices that fit, labelled as such."""
    here = f"{e.devices} {e.device_unit}{'s' if e.devices > 1 else ''}"
    if not e.fits:
        lines = [f"  speed    not quoted for {here}: it does not fit there"]
        there = e.at_devices_needed
        if there:
            lines.append(f"  fewest   {there.devices} {e.device_unit}s fit (tp {there.tp}, pp {there.pp}); there: decode <="
                         f" {there.decode_tokens_per_s_roofline:,.1f} tok/s roofline (~{there.decode_tokens_per_s:,.1f});"
                         f" prefill >= {there.prefill_seconds_roofline:,.2f} s roofline (~{there.prefill_seconds:,.2f} s)")
        return lines
    return [f"  decode   <= {e.decode_tokens_per_s_roofline:,.1f} tok/s roofline ({e.bound}-bound:"
            f" {e.decode_bytes_per_step / 1e9:,.2f} GB read per step at {e.bandwidth_bytes_per_s / 1e9:,.1f} GB/s);"
            f" expect ~{e.decode_tokens_per_s:,.1f} tok/s {e.decode_basis}",
            f"  prefill  >= {e.prefill_seconds_roofline:,.2f} s roofline for {e.batch * e.prompt_tokens:,} prompt tokens"
            f" ({e.prefill_bound}-bound, {e.prefill_flops / 1e12:,.1f} TFLOP at {rate(e.peak_flops)}"
            f" {e.peak_label}); expect ~{e.prefill_seconds:,.2f} s at efficiency {e.efficiency_compute:.2f}"]


def render_text(e: Estimate, formulas: bool = False) -> str:
    """The answer for people: verdict, why, memory, room, devices, speed, formats, advice, command."""
    unit = e.device_unit
    lines = [f"{e.model_name} on {e.devices} x {e.hardware_name} ({gib(e.device_memory_bytes)}, "
             f"{e.bandwidth_bytes_per_s / 1e9:,.1f} GB/s each) with {FRAMEWORK_LABELS[e.framework]}"
             f"{' ' + e.framework_version if e.framework_version else ''}: {e.verdict.upper()}"
             + ("" if e.fits else f" ({e.margin} per {unit})"),
             f"  why      {e.reason}"]
    split = (f": LLM {(e.params_total - e.params_vision) / 1e9:.3f} B + vision/projector {e.params_vision / 1e9:.3f} B"
             if e.params_vision else "")
    active = f"; {e.params_active / 1e9:.2f} B active per token" if e.params_active != e.params_total else ""
    lines.append(f"  params   {e.params_total:,} ({e.params_total / 1e9:.3f} B{split}{active})")
    lines.append(f"  weights  {e.weights_format.upper()}: {gib(e.weight_bytes)} ({e.weight_bytes:,} B)"
                 + (f"; {gib(e.weight_bytes_per_device)} per {unit}" if e.devices > 1 else ""))
    wl = f"{e.batch} sequence(s) x {e.context:,} tokens ({e.prompt_tokens - e.image_tokens:,} text"
    if e.images:
        wl += f" + {e.images} image(s) x {e.tiles} tiles = {e.image_tokens:,} image tokens"
    wl += f" + {e.output_tokens:,} output)"
    lines.append(f"  workload {wl}")
    lines.append(f"  KV cache {e.kv_bytes_per_token:,} B/token ({e.kv_dtype.upper()}) -> {gib(e.kv_bytes)} for this workload")
    parts = (f"weights {gib(e.weight_bytes_per_device)} + KV {gib(e.kv_bytes_per_device)} + activations"
             f" {gib(e.activation_bytes)}" + (f" + mask {gib(e.mask_bytes)}" if e.mask_bytes else "")
             + f" + overhead {gib(e.overhead_bytes)}" + (f" + reserve {gib(e.reserve_bytes)}" if e.reserve_bytes else ""))
    lines.append(f"  memory   {gib(e.total_bytes_per_device)} per {unit} of {gib(e.usable_bytes_per_device)} usable"
                 f" ({gib(e.device_memory_bytes)} total): {parts}")
    if not e.kv_bytes_per_token:
        lines[-1] = (f"  state    no per-token KV: constant state {gib(e.kv_bytes)} for {e.batch} sequence(s)"
                     f" ({e.kv_dtype.upper()})")
    if e.kv_bytes_per_token:
        lines.append(f"  KV room  {gib(e.kv_pool_bytes)} for the KV pool = {e.kv_room_tokens:,} {e.kv_room_unit}"
                     + (f" ({e.kv_room_meaning})" if e.kv_window else "") + " -> longest context"
                     f" at {e.batch} sequence(s): {e.max_context:,}; most sequences at {e.context:,} tokens: {e.max_batch:,}")
    else:
        lines.append(f"  room     memory does not grow with context (longest context limited only by the model);"
                     f" most sequences at {e.context:,} tokens: {e.max_batch:,}")
    if e.devices_needed:
        lines.append(f"  devices  fewest that fit: {e.devices_needed} (tp {e.devices_needed_tp}, pp {e.devices_needed_pp})"
                     + (f": {e.devices_note}" if e.devices_note else ""))
    if e.server:
        lines.append(f"  server   {e.server}")
    for v in e.variants:
        lines.append(f"  variant  {v.hardware_name} ({gib(v.device_memory_bytes)}): {v.verdict.upper()}"
                     + (f", fewest that fit: {v.devices_needed}" if v.devices_needed and not v.fits else ""))
    lines += _speed_lines(e)
    there = e.at_devices_needed
    others = [a for a in e.alternatives if not a.current]
    if others:
        lines.append("  formats  " + "; ".join(
            f"{a.label}: {gib(a.weight_bytes)}, {'fits' if a.fits else 'does not fit'},"
            f" decode <= {a.decode_tokens_per_s_roofline:,.1f} tok/s (~{a.decode_tokens_per_s:,.1f})"
            + (f", KV room {a.kv_room_tokens:,} {e.kv_room_unit}" if e.kv_bytes_per_token else "")
            + (f" [{a.support}]" if a.support != "supported" else "")
            for a in others))
    for s in e.suggestions:
        lines.append(f"  to fit   {s}")
    for w in e.warnings:
        lines.append(f"  warning  {w}")
    for n in e.notes:
        lines.append(f"  note     {n}")
    where = f" on {there.devices} {unit}s (tp {there.tp}, pp {there.pp}), where it fits" if there else ""
    lines.append(f"  serve    with {e.serve_heading}{where}:")
    lines.append(f"           {there.serve_command if there else e.serve_command}")
    if e.serve_note:
        lines.append(f"           ({e.serve_note})")
    if formulas:
        lines.append("  formulas")
        for name, text in e.formulas.items():
            for i, line in enumerate(text.splitlines()):
                lines.append(f"    {name + ':' if i == 0 else '':14} {line}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; 0 on an answer, 2 with one line on stderr for a bad input."""
    try:
        args = build_parser().parse_args(argv)
        if args.list_models:
            print(_list_models(args.json))
            return 0
        if args.list_hardware:
            print(_list_hardware(args.json))
            return 0
        if not args.model:
            raise SizingError("--model is required (or --list-models / --list-hardware)")
        if not args.hardware:
            raise SizingError("--hardware is required (see --list-hardware)")
        _check_name_lengths(args.model, args.hardware)
        workload = Workload(batch=args.batch, context=args.context, prompt=args.prompt, output=args.output,
                            images=args.images, tiles=args.tiles)
        settings = Settings(weights=args.weights, kv_dtype=args.kv_dtype, vision_dtype=args.vision_dtype, tp=args.tp,
                            pp=args.pp, framework=args.framework, framework_version=args.framework_version,
                            gpu_memory_utilization=args.util,
                            block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
                            eta_memory=args.efficiency_memory, eta_compute=args.efficiency_compute)
        est = estimate(args.model, args.hardware, workload, settings)
        if args.json:
            d = est.to_dict()
            d.pop("stages", None)
            if not args.formula:
                d.pop("formulas", None)
            print(json.dumps(d, indent=2, default=float))
        else:
            print(render_text(est, formulas=args.formula))
        return 0
    except SizingError as exc:
        return _refuse(str(exc))
    except BrokenPipeError:  # e.g. piped into head
        return 0
    except OSError as exc:  # an input path the OS cannot open (too long, permissions, a device, ...)
        what = f" {str(exc.filename)[:200]}" if exc.filename else ""
        return _refuse(f"cannot read{what}: {exc.strerror or exc}")
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except Exception as exc:  # noqa: BLE001 - the contract: one line, no traceback
        print(one_line(f"error: unexpected {type(exc).__name__}: {exc}"), file=sys.stderr)
        return 3


MESSAGE_LIMIT = 400
NAME_LIMIT = MAX_NAME_CHARS  # PATH_MAX on Linux: no preset name or path is longer


def _check_name_lengths(model: str, hardware: str) -> None:
    """--model / --hardware longer than any path can be are refused before touching the disk."""
    for flag, value in (("--model", model), ("--hardware", hardware)):
        if len(value) > NAME_LIMIT:
            raise SizingError(f"{flag} is {len(value):,} characters long; a preset name or a path has at most"
                              f" {NAME_LIMIT:,}")



def one_line(text: str) -> str:
    """The message as one line of at most MESSAGE_LIMIT characters (a 5,000-character model name
    is shown by its start and end)."""
    flat = " ".join(text.split())
    if len(flat) <= MESSAGE_LIMIT:
        return flat
    half = MESSAGE_LIMIT // 2 - 2
    return f"{flat[:half]} … {flat[-half:]}"


def _refuse(message: str) -> int:
    """A bad input: one line on stderr, exit status 2."""
    print(one_line(f"error: {message}"), file=sys.stderr)
    return 2
