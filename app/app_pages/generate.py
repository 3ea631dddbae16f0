"""Generate: a prompt box, the instruct model's chat template, streamed output, and the table
of engine steps that produced it. Proves the engine end to end in a browser."""
from __future__ import annotations

import streamlit as st

from app import live, state
from engine.serving import generation
from visualizers.steps import step_table, step_table_csv
from visualizers.text import escape_markdown

st.header("Generate", anchor=False)
st.caption("One request through the real engine, step by step: prefill the prompt, then one decode step per token.")

with st.container(horizontal=True, vertical_alignment="bottom"):
    st.selectbox("Model", state.MODELS, key="gen_model", width=220)
    st.number_input("Max new tokens", min_value=1, max_value=1024, value=64, step=1, key="gen_max_tokens", width=160)
    st.number_input("Temperature", min_value=0.0, max_value=2.0, value=0.0, step=0.1, key="gen_temperature",
                    width=140, help="0 = greedy: the same answer every time, token-identical to Hugging Face.")
    st.toggle("Chat template", value=True, key="gen_chat",
              help="Wrap the prompt in the model's chat template (SmolLM2-135M-Instruct is a chat model).")
prompt = st.text_area("Prompt", value="What is the capital of France?", key="gen_prompt", height=100)
clicked = st.button("Generate", type="primary", key="generate", icon=":material/send:", shortcut="Ctrl+Enter")

result = None
if clicked:
    try:
        request = generation.GenerateRequest(prompt=prompt, model=st.session_state["gen_model"],
                                             max_tokens=int(st.session_state["gen_max_tokens"]),
                                             temperature=float(st.session_state["gen_temperature"]),
                                             chat_template=bool(st.session_state["gen_chat"]))
        shared = state.load_model(request.model)
        session = generation.start(shared, request)
    except ValueError as e:
        st.error(escape_markdown(e), icon=":material/error:")
    else:
        with st.chat_message("assistant"):
            st.write_stream(escape_markdown(piece, keep_newlines=True) for piece in session.stream())
        result = session.result()
        state.set_generate_result(result)
else:
    result = state.generate_result()
    if result is not None:
        with st.chat_message("assistant"):
            st.markdown(escape_markdown(result.text, keep_newlines=True))

if result is not None:
    cols = st.columns(4)
    cols[0].metric("Prompt tokens", result.prompt_tokens)
    cols[1].metric("Output tokens", result.output_tokens)
    cols[2].metric("Engine steps", len(result.traces))
    cols[3].metric("Finish reason", escape_markdown(result.finish_reason or "—"))
    with st.expander("Exact prompt sent to the model"):
        st.code(result.formatted_prompt, language=None, wrap_lines=True)
    st.subheader("Engine steps that produced it", anchor=False)
    live.table(step_table(result.traces), "generate_steps")
    st.download_button("Step table (CSV)", data=step_table_csv(result.traces), file_name="inferscope-generate-steps.csv",
                       mime="text/csv", on_click="ignore", key="generate_csv", icon=":material/table:")
