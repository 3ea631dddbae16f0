"""The "FlashAttention" page through Streamlit's AppTest, on the real engine with `tiny-random`.

A live run of chat-burst: step 1 prefills every prompt, step 2 decodes them. The page renders
with no exception; the tile table's final m / l and the output equal a direct
``paged_attention_reference`` on the same tensors (recomputed here independently); a decode
split into 4 segments merges to the 1-segment output; the traffic table follows the formula
(one case by hand); a replay, a simulated run and a session before the first step give a
message, never an exception.

TRITON_INTERPRET=1 is set at import, before anything imports engine.kernels (the page would set
it too, but only if nothing imported the kernels before).
"""
from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before engine.kernels is imported

import torch  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import pytest  # noqa: E402
from app.session import K  # noqa: E402
from engine.kernels import paged_attention_reference  # noqa: E402
from engine.replay.recording import record, to_json  # noqa: E402
from engine.studies.flash_attention import FlashStudy, layer_tensors  # noqa: E402
from tests.test_live_app import MAIN, TIMEOUT, charts, errors, metric, ok, open_app, run_n  # noqa: E402

FLASH = "app_pages/flash_attention.py"
SCENARIO = "chat-burst"
TOL = 1e-5

pytestmark = pytest.mark.usefixtures("streamlit_clean")  # tests/conftest.py


def current_study(at: AppTest) -> FlashStudy:
    """The trace the page drew last: the newest entry of the session's cache."""
    held = at.session_state[K.flash_traces]
    assert held is not None
    return list(held[1].values())[-1]


def infos(at: AppTest) -> list[str]:
    return [str(i.value) for i in at.info]


def direct_reference(at: AppTest, study: FlashStudy) -> torch.Tensor:
    """softmax(QKᵀ)V of the study's request, layer and head by paged_attention_reference, on
    tensors recomputed here from the run's own snapshot and model: [n, head_dim] float64."""
    run = at.session_state[K.run]
    snap = run.view().snapshot
    state = next(r for r in snap.requests if r.request_id == study.request_id)
    blocks = {b.block_id: b for b in snap.blocks}
    ids = [t for b in state.block_table for t in blocks[b].token_ids][:study.seq_len]
    tensors = layer_tensors(run.engine.runner.model, tuple(ids), study.layer, snap.block_size, "float32")
    bs, d = snap.block_size, study.head_dim
    k_cache = torch.zeros(snap.num_blocks, bs, tensors.k.shape[1], d)
    v_cache = torch.zeros_like(k_cache)
    pos = torch.arange(study.seq_len)
    table = torch.tensor(state.block_table)
    k_cache[table[pos // bs], pos % bs] = tensors.k
    v_cache[table[pos // bs], pos % bs] = tensors.v
    q = tensors.q[study.start:study.seq_len]
    out = paged_attention_reference(q, k_cache, v_cache, table[None], torch.tensor([study.seq_len]),
                                    torch.tensor([0, study.num_tokens]), tensors.scale)
    return out[:, study.query_head]


def test_the_page_traces_a_prefill_then_a_split_decode() -> None:
    at = open_app(FLASH, scenario=SCENARIO)
    assert "FlashAttention" in [h.value for h in at.header] and not errors(at)
    assert any("Step the run" in i for i in infos(at))

    run_n(at, 1)  # every prompt prefilled
    assert not errors(at)
    assert {"chart_flash_scores", "chart_flash_partial", "chart_flash_running"} <= set(charts(at))
    at.selectbox(key=K.flash_head).set_value(3)
    ok(at.run())
    study = current_study(at)
    assert study.kind == "prefill" and study.start == 0 and study.query_head == 3 and study.step == 1
    assert float(metric(at, "Max abs difference")) <= 1e-6
    assert study.live_cache_difference is not None and study.live_cache_difference <= TOL
    ref = direct_reference(at, study)
    assert (torch.tensor(study.out, dtype=torch.float64) - ref).abs().max() <= TOL
    final = next(d.value for d in at.dataframe if "float64 m" in d.value.columns)
    assert len(final) == study.num_tokens
    assert (final["kernel m"] - final["float64 m"]).abs().max() <= TOL
    assert ((final["kernel l"] - final["float64 l"]).abs() / final["float64 l"]).max() <= TOL
    # the tile table shows the chosen tile's rows as the kernel stored them
    tile = study.tiles[at.session_state[K.flash_tile]]
    shown = next(d.value for d in at.dataframe if "m (running max)" in d.value.columns)
    assert list(shown["m (running max)"]) == list(tile.m) and list(shown["l (running sum)"]) == list(tile.l)
    # the traffic table's step row follows the formula: H 4, KVH 2, d 16, fp32, N = M = the prompt
    traffic = next(d.value for d in at.dataframe if "quantity" in d.value.columns).set_index("quantity")
    n = study.seq_len
    naive = 2 * 4 * n * 4 * 16 + 2 * 4 * n * 2 * 16 + 4 * 4 * 4 * n * n
    tiled = 2 * 4 * n * 4 * 16 + 2 * 4 * n * 2 * 16 * -(-n // study.block_m)
    assert traffic.loc["naive / tiled"].iloc[0] == f"{naive / tiled:.2f}"
    assert list(traffic.columns) == [f"this step (r{study.request_id})", "Llama-3-8B"]
    assert any(f"{naive:,} B" in m.value and f"{tiled:,} B" in m.value for m in at.markdown)

    run_n(at, 1)  # decodes
    at.slider(key=K.flash_segments).set_value(4)
    ok(at.run())
    split = current_study(at)
    assert split.kind == "decode" and split.num_segments == 4 and len(split.segments) == 4
    assert split.merged_vs_unsplit is not None and split.merged_vs_unsplit <= TOL
    assert any("Merge" in m.value for m in at.markdown)
    at.slider(key=K.flash_segments).set_value(1)
    ok(at.run())
    one = current_study(at)
    assert one.num_segments == 1 and one.request_id == split.request_id
    assert max(abs(a - b) for a, b in zip(one.out[0], split.out[0])) <= TOL
    ref = direct_reference(at, one)
    assert (torch.tensor(one.out, dtype=torch.float64) - ref).abs().max() <= TOL


def test_replay_and_simulated_runs_give_a_message() -> None:
    live = open_app(FLASH, scenario=SCENARIO)
    run_n(live, 2)
    text = to_json(record(live.session_state[K.run]))

    at = open_app(FLASH, scenario=SCENARIO)
    at.file_uploader(key=K.upload).set_value(("run.json", text.encode(), "application/json"))
    ok(at.run())
    run_n(at, 2)
    assert any("recording holds the steps" in i for i in infos(at)) and not errors(at)
    assert any("quantity" in d.value.columns for d in at.dataframe)  # the calculator part still draws

    sim = AppTest.from_file(str(MAIN), default_timeout=TIMEOUT)  # the Serving page's "Step through it"
    ok(sim.run())
    ok(sim.switch_page("app_pages/serving.py").run())
    sim.number_input(key="sv_n").set_value(2)
    ok(sim.run())
    ok(sim.button(key="sv_run").click().run())
    ok(sim.button(key="sv_step_through").click().run())
    ok(sim.switch_page(FLASH).run())
    assert any("Not available for a simulated run" in i for i in infos(sim)) and not errors(sim)
