"""Command lines pasted with a log: what the user asked for is stated as much as what was printed.

    vllm serve MODEL --tensor-parallel-size 2 --enable-prefix-caching ...
    python -m vllm.entrypoints.openai.api_server --model MODEL ...
    python -m sglang.launch_server --model-path MODEL --disable-radix-cache ...
    llama-server -m x.gguf -c 8192 -ngl 99 -fa -ctk q8_0 -ctv q8_0 ...     (llama-cli, llama-bench, ./main alike)

Only flags with a canonical meaning are read; a line that does not split as a shell command is
skipped. Benchmark clients (``vllm bench serve``, ``sglang.bench_serving``) are not servers and are
not read.
"""
from __future__ import annotations

import re
import shlex

from engine.audit.evidence import Setting, Value
from engine.audit.readers.common import Found, literal, nothing

_VLLM = re.compile(r"(?:^|[\s/>$])(?:vllm serve\s|python3?\s+-m\s+vllm\.entrypoints\.openai\.api_server\b)")
_SGLANG = re.compile(r"python3?\s+-m\s+sglang\.launch_server\b")
_LLAMA = re.compile(r"(?:^|[\s/>$\\])llama-(?:server|cli|bench)(?:\.exe)?\s|/main\s")  # ./main: before llama-cli

#: flag -> (canonical name, how the value reads: "int" | "float" | "str" | True/False for a switch)
_VLLM_FLAGS: dict[str, tuple[str, object]] = {
    "--model": ("model", "str"), "--tensor-parallel-size": ("tensor_parallel_size", "int"),
    "-tp": ("tensor_parallel_size", "int"), "--pipeline-parallel-size": ("pipeline_parallel_size", "int"),
    "-pp": ("pipeline_parallel_size", "int"), "--enable-prefix-caching": ("enable_prefix_caching", True),
    "--no-enable-prefix-caching": ("enable_prefix_caching", False),
    "--enable-chunked-prefill": ("enable_chunked_prefill", True),
    "--no-enable-chunked-prefill": ("enable_chunked_prefill", False), "--enforce-eager": ("cuda_graphs", False),
    "--kv-cache-dtype": ("kv_cache_dtype", "str"), "--quantization": ("quantization", "str"),
    "-q": ("quantization", "str"), "--max-model-len": ("max_model_len", "int"),
    "--gpu-memory-utilization": ("gpu_memory_utilization", "float"), "--max-num-seqs": ("max_num_seqs", "int"),
    "--speculative-config": ("speculative", "str"), "--speculative-model": ("speculative", "str"),
}
_SGLANG_FLAGS: dict[str, tuple[str, object]] = {
    "--model-path": ("model", "str"), "--model": ("model", "str"), "--tp-size": ("tensor_parallel_size", "int"),
    "--tp": ("tensor_parallel_size", "int"), "--pp-size": ("pipeline_parallel_size", "int"),
    "--disable-radix-cache": ("enable_prefix_caching", False), "--disable-cuda-graph": ("cuda_graphs", False),
    "--kv-cache-dtype": ("kv_cache_dtype", "str"), "--quantization": ("quantization", "str"),
    "--attention-backend": ("attention_backend", "str"), "--context-length": ("max_model_len", "int"),
    "--mem-fraction-static": ("gpu_memory_utilization", "float"),
    "--max-running-requests": ("max_num_seqs", "int"), "--speculative-algorithm": ("speculative", "str"),
    "--chunked-prefill-size": ("enable_chunked_prefill", "chunk"),
}
_LLAMA_FLAGS: dict[str, tuple[str, object]] = {
    "-m": ("model", "str"), "--model": ("model", "str"), "-c": ("max_model_len", "int"),
    "--ctx-size": ("max_model_len", "int"), "-ngl": ("n_gpu_layers", "int"), "--n-gpu-layers": ("n_gpu_layers", "int"),
    "--gpu-layers": ("n_gpu_layers", "int"), "-fa": ("flash_attn", "fa"), "--flash-attn": ("flash_attn", "fa"),
    "-ctk": ("kv_cache_dtype", "str"), "--cache-type-k": ("kv_cache_dtype", "str"),
}


def _value(kind: object, args: list[str], i: int) -> tuple[Value, int]:
    """(value, how many argv items it took after the flag)."""
    if isinstance(kind, bool):
        return kind, 0
    nxt = args[i + 1] if i + 1 < len(args) else None
    if kind == "fa":  # llama.cpp: a bare -fa (older builds) or -fa on|off|auto|1|0
        if nxt is not None and nxt.lower() in ("on", "off", "auto", "1", "0", "true", "false"):
            return {"on": True, "1": True, "true": True, "off": False, "0": False, "false": False}.get(
                nxt.lower(), nxt.lower()), 1
        return True, 0
    if nxt is None or (nxt.startswith("-") and not re.fullmatch(r"-[0-9.]+", nxt)):
        return None, 0
    if kind == "chunk":
        v = literal(nxt)
        return (v > 0 if isinstance(v, int) else None), 1
    if kind == "int":
        return (int(nxt) if re.fullmatch(r"-?[0-9]+", nxt) else None), 1
    if kind == "float":
        try:
            return float(nxt), 1
        except ValueError:
            return None, 1
    return nxt, 1


def _read_argv(args: list[str], flags: dict[str, tuple[str, object]], positional_model: bool,
               n: int, line: str, out: dict[str, Setting]) -> None:
    i = 0
    while i < len(args):
        a = args[i]
        flag, _, inline = a.partition("=")
        if flag.startswith("--"):  # vLLM and SGLang take --max_num_seqs as --max-num-seqs
            flag = flag.replace("_", "-")
        if flag in flags:
            name, kind = flags[flag]
            if inline:
                value: Value = _value(kind, [flag, inline], 0)[0]
                took = 0
            else:
                value, took = _value(kind, args, i)
            if value is not None:
                out.setdefault(name, Setting(name, value, "log", line, n))
            i += 1 + took
            continue
        if positional_model and a == "serve" and i + 1 < len(args) and not args[i + 1].startswith("-"):
            out.setdefault("model", Setting("model", args[i + 1], "log", line, n))
            i += 2
            continue
        i += 1


def _continued(lines: list[str]) -> list[tuple[int, str, str]]:
    """(1-based number of its first line, the lines verbatim, the command) of each command, a
    trailing backslash joining the next line as a shell does."""
    out: list[tuple[int, str, str]] = []
    open_ = False
    for n, line in enumerate(lines, 1):
        if open_ and out:
            first, verbatim, command = out[-1]
            out[-1] = (first, verbatim + "\n" + line, command[:-1].rstrip() + " " + line.strip())
        else:
            out.append((n, line, line.rstrip()))
        open_ = out[-1][2].endswith("\\")
    return out


def read(lines: list[str]) -> Found:
    """Settings from server command lines (module doc); the framework of the first one read."""
    out: dict[str, Setting] = {}
    used: set[int] = set()
    framework: tuple[str, int, str] | None = None
    for n, line, command in _continued(lines):
        text = command.strip().lstrip(">$ ").strip()
        which = ("vllm", _VLLM_FLAGS, True) if _VLLM.search(" " + text) and "bench" not in text.split()[:3] else \
            ("sglang", _SGLANG_FLAGS, False) if _SGLANG.search(text) else \
            ("llama.cpp", _LLAMA_FLAGS, False) if _LLAMA.search(" " + text) else None
        if which is None:
            continue
        try:
            args = shlex.split(text, posix=True)
        except ValueError:
            continue
        before = len(out)
        _read_argv(args, which[1], which[2], n, line, out)
        if len(out) > before:
            used.add(n)
            framework = framework or (which[0], n, line)
    if framework is None:
        return nothing()
    fw = Setting("framework", framework[0], "log", framework[2], framework[1])
    return Found([fw, *out.values()], None, used, [])
