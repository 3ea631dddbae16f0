"""The Streamlit app: thin page scripts over a few small modules, each named after its concept.

main.py                 entry point: page config, navigation, the live pages' shared controls
app_pages/*.py          one thin script per page: controls -> engine / studies -> visualizers -> st.*
controls.py, live.py    the live pages' sidebar and their common frame (status row, views fragment)
session.py              the browser session's state: every key as one typed slot; the only module
                        that touches st.session_state (tests/test_app_modules.py checks it)
models.py               the one process-wide model cache (weights shared by every session)
scenarios.py, knobs.py  which scenario runs, and the controls as engine knobs
run_spec.py             the record a run is built from (RunSpec): model, scenario, EngineConfig
current_run.py          the session's run (live or replay): build, rebuild, close, errors
playback.py             Step / Step back / Run N / Play / Reset and the history cursor
step_queue.py           the browser-side Step counter and key map (a component)
replay.py               record / replay and deep links
link_settings.py        URL settings a page could not take, named in one warning
presentation.py         presentation mode and the KV page's focus
studies/                what pages measure beyond the run: comparisons, quantization, activations,
                        the pipeline sweep, sizing, the Generate answer, the FlashAttention kernel traces
charts.py, timing.py    in-place chart redraws; optional phase timings
session_reaper.py       stops the workers of sessions that went away
"""
