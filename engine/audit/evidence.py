"""What a deployment is known to run with: settings with where each came from.

A ``Setting`` is one canonical setting (``CANONICAL``) with its value and its source:

    "log"       a reader found it in a pasted log (``line`` is that line, verbatim; ``line_no`` 1-based)
    "setting"   the user typed it (CLI flag or page field)
    "default"   nobody stated it: the framework version's documented default (knowledge.py)

``Evidence`` is what one or more readers understood of a text: the settings, a benchmark's figures,
which lines they read, and warnings (a contradiction, an unknown version). Readers never raise on
bad text: an unrelated or truncated log is evidence of nothing, with its lines counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

#: canonical setting names (also the CLI's JSON keys), as issue #23 names them
CANONICAL: tuple[str, ...] = (
    "framework", "version", "model", "tensor_parallel_size", "pipeline_parallel_size", "enable_prefix_caching",
    "enable_chunked_prefill", "cuda_graphs", "kv_cache_dtype", "quantization", "attention_backend", "max_model_len",
    "gpu_memory_utilization", "max_num_seqs", "kv_cache_tokens", "speculative", "flash_attn", "n_gpu_layers",
    "cpu_features")

Source = Literal["log", "setting", "default"]
Value = bool | int | float | str | None


@dataclass(frozen=True)
class Setting:
    """One canonical setting's value and where it came from (module doc)."""

    name: str
    value: Value
    source: Source
    line: str = ""  # the log line it was read from (source "log"), verbatim
    line_no: int = 0  # 1-based, in the text given (source "log")

    def __post_init__(self) -> None:
        if self.name not in CANONICAL:
            raise ValueError(f"setting: unknown name {self.name!r} (one of {', '.join(CANONICAL)})")


@dataclass(frozen=True)
class Benchmark:
    """Figures a benchmark block states (``vllm bench serve``, SGLang ``bench_serving``, ``llama-bench``).

    ``figures``: snake_case label -> value as printed (ms for latencies, as the tools print them);
    ``rates``: llama-bench rows, test name (``pp512``, ``tg128``) -> tokens/s."""

    kind: Literal["serving", "llama-bench"]
    figures: dict[str, float] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)
    lines: tuple[int, ...] = ()  # 1-based line numbers read

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Per-request decode speed: 1000 / median (else mean) TPOT, or llama-bench's tg rate."""
        for key in ("median_tpot_ms", "mean_tpot_ms"):
            v = self.figures.get(key)
            if v:
                return 1000.0 / v
        tg = [v for k, v in self.rates.items() if k.startswith("tg")]
        return tg[0] if tg else None

    @property
    def ttft_s(self) -> float | None:
        for key in ("median_ttft_ms", "mean_ttft_ms"):
            v = self.figures.get(key)
            if v is not None:
                return v / 1000.0
        return None


@dataclass(frozen=True)
class Evidence:
    """What readers understood of a text (module doc)."""

    formats: tuple[str, ...]  # the readers that understood something ("vllm", "sglang", ...)
    settings: dict[str, Setting]  # canonical name -> the first statement of it
    benchmark: Benchmark | None
    lines_total: int
    lines_understood: tuple[int, ...]  # 1-based line numbers any reader took something from
    warnings: tuple[str, ...] = ()
    engine: str | None = None  # vLLM's engine generation where the log says ("V0" | "V1")
    devices: tuple[tuple[str, int], ...] = ()  # (a device the log names, its 1-based line)

    @property
    def understood_anything(self) -> bool:
        return bool(self.settings or self.benchmark)

    def summary(self) -> str:
        """One line: what was understood (for a page or a CLI)."""
        if not self.understood_anything:
            return (f"understood none of {self.lines_total:,} line(s): not a vLLM, SGLang, llama.cpp, vllm-ascend "
                    f"log or a benchmark block this reader knows")
        what = [f"{len(self.settings)} setting(s)"] + (["a benchmark block"] if self.benchmark else [])
        return (f"understood {len(self.lines_understood):,} of {self.lines_total:,} line(s) "
                f"({', '.join(self.formats)}): {' and '.join(what)}")
