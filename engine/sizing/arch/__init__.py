"""Hugging Face ``config.json`` -> a sizing description of the model (``ModelSpec``).

Pure Python. Parameter counts follow the modules transformers builds for each architecture
(checked against meta-device instantiation in tests/test_memory_meta.py); KV-cache elements
per token follow sizing.md §3.3 (GQA/MQA, MLA latent, sliding windows, Mamba state).

Modules (one family per module; ``config`` picks the family, the others count it):
  records    ModelSpec, LayerSpec, VisionSpec, Checkpoint
  fields     the field readers (type and range checked) and the checkpoint dtype
  attention  head layouts (MHA/GQA/MQA) and sliding windows per layer
  llama      llama, mistral, mixtral, qwen2(_moe), qwen3(_moe), gemma(2/3), phi3, internlm2,
             cohere(2) (Command-R), ... (``KNOWN_LLAMA_LIKE``)
  llama4     Llama-4 text (Scout, Maverick): routed + shared experts, chunked local attention
  mla        deepseek_v2, deepseek_v3 (kimi_k2): latent KV, routed + shared experts
  falcon     falcon / RefinedWeb (MQA, parallel attention, LayerNorm, GELU MLP)
  ssm        mamba (v1) and mamba2 selective SSMs
  hybrid     jamba: attention + Mamba layers, MoE on every other layer
  dense      GPT-style: gpt2 (learned positions, n_inner null = 4h), gpt_neox (Pythia), phi
             (Phi-1/1.5/2), starcoder2, bloom (ALiBi), opt (offset positions, projections), gptj:
             LayerNorm, non-gated GELU/ReLU MLP, biases
  vision     InternVL chat (vision_config + llm_config), HF-native internvl, Qwen2-VL and
             Qwen2.5-VL (their own ViT + patch merger), Gemma-3 (SigLIP + projector), Llama-4
             (its ViT + pixel-shuffle adapter), llava-style (generic CLIP formula, approximate)
  quantization  a quantized checkpoint's stored format (quantization_config)
  config     the entry point: model_type -> family; any other model_type is refused by name
             (``unknown_family``), never counted as another family

Every field read is validated (type and range); a bad one raises SizingError with one line
naming it (``config field 'vision_config.depth' must be >= 1, got 0``).
"""
from __future__ import annotations

from .config import model_from_config as model_from_config
from .config import supported_model_types as supported_model_types
from .config import unknown_family as unknown_family
from .fields import MAX_DIM as MAX_DIM
from .fields import MAX_LAYERS as MAX_LAYERS
from .fields import MAX_POSITIONS as MAX_POSITIONS
from .fields import MAX_VOCAB as MAX_VOCAB
from .quantization import QuantScheme as QuantScheme
from .quantization import quant_scheme as quant_scheme
from .records import Checkpoint as Checkpoint
from .records import LayerSpec as LayerSpec
from .records import ModelSpec as ModelSpec
from .records import VisionSpec as VisionSpec
