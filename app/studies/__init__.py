"""What the pages measure beyond the session's run, one module per study: the side-by-side
comparisons (scheduling policy, prefix caching, speculation), the Quantization page's weight
inspections and measurements, the live run's activation statistics, the Pipeline page's bubble
sweep, and the Generate page's answer. Process-wide results (read-only records shared by every
session) sit behind ``st.cache_resource``; per-session ones in the session (app/session.py).
"""
