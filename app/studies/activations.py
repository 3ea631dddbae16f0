"""The Quantization page's activation study: statistics of the session's live run (its
ActivationRecorder saw every token its engine computed); a replay has none."""
from __future__ import annotations

from typing import TYPE_CHECKING

from app.current_run import live_run

if TYPE_CHECKING:
    from engine.model.activations import ActivationStats


def run_activation_stats(linear: str, threshold: float, layer: int | None = None) -> ActivationStats | None:
    """The live run's activation statistics, the histogram of ``layer`` (None: the loudest);
    None in a replay or before the first step."""
    current = live_run()
    if current is None:
        return None
    return current.activation_recorder().stats(threshold, layer, linear)
