"""The parallelism concern: tensor (TP) and pipeline (PP) parallel sizes, how layers split into
pipeline stages, and the fewest devices a model needs laid out the way serving engines run it.

Fewest devices (what vLLM / SGLang deployments actually use):
  1. TP within one node: the smallest TP in {1, 2, 4, 8} (valid for the model's heads, at most
     the devices per node: the hardware's figure if it has one, else 8) that fits, with PP 1.
  2. Then PP across nodes: TP = the largest valid TP <= devices per node (8 on an 8-GPU node),
     PP = 2, 3, ... (PP x TP devices) until it fits.
  3. When no TP > 1 divides the model's heads, a pipeline-only layout (TP 1, PP n) is chosen,
     and said so.
The memory-only minimum (any TP x PP, e.g. TP 1 x PP 11) is also computed: when it is smaller
than the layout above, the answer says so, so nothing hides behind the layout rule.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .arch import ModelSpec
from .checks import Remarks, whole_number
from .formats import SizingError
from .hardware import Hardware

MAX_DEVICES = 64
TP_SIZES = (1, 2, 4, 8)
DEFAULT_DEVICES_PER_NODE = 8


def tp_problem(model: ModelSpec, tp: int) -> str:
    """Why ``tp`` cannot split this model ('' if it can): it must divide the attention heads, and
    TP and the KV heads must divide one another (KV heads are replicated when TP is larger)."""
    if model.num_heads and model.num_heads % tp:
        return f"tp {tp} does not divide the {model.num_heads} attention heads"
    kv = model.layers[0].kv_heads if model.layers else 0
    if kv and kv % tp and tp % kv:
        return f"tp {tp} and the {kv} KV heads must divide one another"
    return ""


def tp_valid(model: ModelSpec, tp: int) -> bool:
    return tp >= 1 and not tp_problem(model, tp)


def stage_sizes(num_layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage, as vLLM's get_pp_indices splits them (extra layers before the last)."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    return sizes


def devices_per_node(hw: Hardware) -> int:
    """Devices one node holds: the hardware's figure when it has one, else 8 (the usual server)."""
    n = getattr(hw, "devices_per_node", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else DEFAULT_DEVICES_PER_NODE


@dataclass(frozen=True)
class Parallel:
    """TP x PP devices for one model replica."""

    tp: int
    pp: int

    @property
    def devices(self) -> int:
        return self.tp * self.pp


def resolve_parallel(model: ModelSpec, hw: Hardware, tp: int | None, pp: int, remarks: Remarks) -> Parallel:
    """TP defaults to the chips on one card, or to a server preset's devices (the largest of them
    in 8, 4, 2 that splits the model's heads), when valid, else 1; both <= 64; PP <= layers."""
    pp_ok = whole_number("pp (pipeline parallel size)", pp, 1, MAX_DEVICES)
    if tp is None and hw.server and hw.devices_per_node:
        tp_ok = next((t for t in (hw.devices_per_node, *sorted(TP_SIZES, reverse=True))
                      if t <= hw.devices_per_node and tp_valid(model, t)), 1)
    elif tp is None:
        tp_ok = hw.devices_per_card if tp_valid(model, hw.devices_per_card) else 1
    else:
        tp_ok = whole_number("tp (tensor parallel size)", tp, 1, MAX_DEVICES)
    if not tp_valid(model, tp_ok):
        raise SizingError(tp_problem(model, tp_ok))
    if pp_ok > model.num_layers:
        raise SizingError(f"pp {pp_ok} is more than the model's {model.num_layers} layers")
    if model.num_kv_heads and tp_ok > model.num_kv_heads and model.layers[0].kv_heads:
        remarks.note(f"TP {tp_ok} > {model.num_kv_heads} KV heads: KV heads are replicated"
                     f" (each device holds 1 KV head per layer)")
    return Parallel(tp_ok, pp_ok)


@dataclass(frozen=True)
class DeviceLayout:
    """The fewest devices that fit, as an engine would lay them out (module doc)."""

    devices: int
    tp: int
    pp: int
    rule: str  # "tp-in-node" | "pp-across-nodes" | "pipeline-only"
    node: int  # devices per node assumed
    memory_minimum: Parallel | None  # a smaller memory-only layout, when there is one

    @property
    def explanation(self) -> str:
        """One sentence: which rule chose this layout, and what fewer devices would need."""
        if self.rule == "tp-in-node":
            text = f"TP {self.tp} within one node"
        elif self.rule == "pp-across-nodes":
            text = (f"TP {self.tp} per node x PP {self.pp} across nodes: TP up to {self.node} within a node"
                    " is not enough")
        else:
            text = (f"pipeline-only (TP 1 x PP {self.pp}): no TP in 2, 4, 8 splits the model's attention heads"
                    if self.tp == 1 else f"TP {self.tp} x PP {self.pp} (no larger TP splits the model's heads)")
        low = self.memory_minimum
        if low is not None:
            text += (f"; memory alone would fit {low.devices} (TP {low.tp} x PP {low.pp}), a layout serving"
                     " engines rarely run")
        return text


def _node_tps(model: ModelSpec, node: int, card: int) -> list[int]:
    """TP sizes an engine runs within a node: {1, 2, 4, 8} (and the chips of one card), valid
    for the model and at most the node."""
    sizes = sorted({t for t in (*TP_SIZES, card) if t <= max(node, card)})
    return [t for t in sizes if tp_valid(model, t)]


def _memory_minimum(model: ModelSpec, fits: Callable[[int, int], bool], below: int) -> Parallel | None:
    """Any valid TP x PP (TP in {1, 2, 4, 8}) on fewer than ``below`` devices that fits."""
    tps = [t for t in TP_SIZES if tp_valid(model, t)]
    for n in range(1, below):
        for tp in tps:
            if n % tp == 0 and n // tp <= model.num_layers and fits(tp, n // tp):
                return Parallel(tp, n // tp)
    return None


def fewest_devices(model: ModelSpec, hw: Hardware, fits: Callable[[int, int], bool],
                   weight_bytes: float, usable: int) -> DeviceLayout | None:
    """The fewest devices that fit (module doc), or None within 64 devices.
    ``fits(tp, pp)`` answers for the plan's workload; ``weight_bytes / usable`` bounds the search
    from below (the weights alone need at least that many devices)."""
    node = devices_per_node(hw)
    tps = _node_tps(model, node, hw.devices_per_card)
    lower = max(1, int(weight_bytes // max(usable, 1)))
    chosen: tuple[int, int, str] | None = None
    for tp in tps:
        if tp >= lower and fits(tp, 1):
            chosen = (tp, 1, "tp-in-node")
            break
    if chosen is None:
        top = tps[-1]
        rule = "pp-across-nodes" if top == max(t for t in TP_SIZES if t <= node) else "pipeline-only"
        for pp in range(2, MAX_DEVICES // top + 1):
            if pp <= model.num_layers and top * pp >= lower and fits(top, pp):
                chosen = (top, pp, rule)
                break
    if chosen is None:
        return None
    tp, pp, rule = chosen
    low = _memory_minimum(model, fits, tp * pp) if tp * pp > 1 else None
    return DeviceLayout(devices=tp * pp, tp=tp, pp=pp, rule=rule, node=node, memory_minimum=low)
