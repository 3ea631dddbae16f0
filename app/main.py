"""InferScope entry point: page configuration, navigation, and the controls the live views share.

Pages live in app/app_pages/ (not pages/, which Streamlit would auto-discover as a legacy
multipage app). Each page script stays thin: read controls, call engine / visualizers, render.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `streamlit run app/main.py` puts only app/ on the path
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app import controls, timing  # noqa: E402

def main() -> None:
    """Navigation over the pages; the live pages get the shared controls."""
    GENERATE = st.Page("app_pages/generate.py", title="Generate", icon="💬", default=True)
    KV_CACHE = st.Page("app_pages/kv_cache.py", title="Paged KV cache", icon="🧱", url_path="kv-cache")
    BATCHING = st.Page("app_pages/batching.py", title="Batch composition", icon="📊", url_path="batching")
    PREFIX_CACHE = st.Page("app_pages/prefix_cache.py", title="Prefix cache", icon="🌳", url_path="prefix-cache")
    QUANTIZATION = st.Page("app_pages/quantization.py", title="Quantization", icon="🎚️", url_path="quantization")
    SPECULATIVE = st.Page("app_pages/speculative.py", title="Speculative decoding", icon="🎯", url_path="speculative")
    PIPELINE = st.Page("app_pages/pipeline.py", title="Pipeline parallelism", icon="🪜", url_path="pipeline")
    FLASH = st.Page("app_pages/flash_attention.py", title="FlashAttention", icon="⚡", url_path="flash-attention")
    PAGES = {
        "Engine": [GENERATE, KV_CACHE, BATCHING, PREFIX_CACHE, QUANTIZATION, SPECULATIVE, PIPELINE, FLASH],
        "Sizing": [
            st.Page("app_pages/fit.py", title="Will it fit?", icon="📐", url_path="fit"),
            st.Page("app_pages/architectures.py", title="Attention architectures", icon="🧠",
                    url_path="architectures"),
            st.Page("app_pages/serving.py", title="Serving under load", icon="📈", url_path="serving"),
            st.Page("app_pages/audit.py", title="Audit", icon="🩺", url_path="audit"),
        ],
    }
    LIVE = [KV_CACHE, BATCHING, PREFIX_CACHE, QUANTIZATION, SPECULATIVE, PIPELINE, FLASH]  # the order of the page keys
    LIVE_PAGES = tuple(p.url_path for p in LIVE)
    with timing.phase("script"):
        page = st.navigation(PAGES, position="top")
        live = page.url_path in LIVE_PAGES
        if live:
            controls.switch_page(page, LIVE)
            places = controls.prepare(page.url_path)
        page.run()
        if live:  # the sidebar goes last so the views reach the browser first
            with timing.phase("sidebar"):
                controls.sidebar(places)


st.set_page_config(page_title="InferScope", page_icon="🔬", layout="wide")
main()
