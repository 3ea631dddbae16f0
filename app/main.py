"""InferScope entry point: page configuration and navigation only.

Pages live in app/app_pages/ (not pages/, which Streamlit would auto-discover as a legacy
multipage app). Each page script stays thin: read controls, call engine / visualizers, render.
"""
import streamlit as st

st.set_page_config(page_title="InferScope", page_icon="🔬", layout="wide")

PAGES = {
    "Engine": [
        st.Page("app_pages/generate.py", title="Generate", icon="💬", default=True),
    ],
    "Sizing": [
        st.Page("app_pages/fit.py", title="Will it fit?", icon="📐", url_path="fit"),
    ],
}

st.navigation(PAGES, position="top").run()
