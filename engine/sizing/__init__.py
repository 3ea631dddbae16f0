"""Hardware-fit calculator internals (pure Python; no torch). Public API: engine.memory."""
from .arch import Checkpoint, LayerSpec, ModelSpec, VisionSpec, model_from_config
from .advice import serve_command
from .estimate import CurvePoint, Estimate, HardwareRow, compare_hardware, concurrency_curve, estimate, kv_bytes_per_token, weight_bytes
from .plan import (FRAMEWORK_LABELS, Plan, Settings, Workload, ascend_mask_bytes, gib, rate,
                   roofline_decode_tokens_per_s)
from .workload import MAX_BATCH, MAX_CONTEXT
from .formats import KV_DTYPES, WEIGHT_FORMATS, SizingError, kv_dtype, weight_format
from .hardware import (FRAMEWORKS, GiB, MiB, Hardware, Measurement, PresetInfo, Source, custom_hardware, get_hardware,
                       hardware_from_dict, hardware_info, hardware_presets, measure_this_machine, preset_info)
from .models import (checkpoint_from_folder, get_model, model_from_folder, model_from_path, model_preset_config,
                     model_presets, parse_config_text, read_safetensors_header)

__all__ = [
    "Checkpoint", "LayerSpec", "ModelSpec", "VisionSpec", "model_from_config", "Estimate", "Plan", "Settings",
    "Workload", "FRAMEWORK_LABELS", "ascend_mask_bytes", "compare_hardware", "concurrency_curve", "gib", "rate", "estimate", "kv_bytes_per_token",
    "roofline_decode_tokens_per_s", "serve_command", "weight_bytes", "KV_DTYPES", "WEIGHT_FORMATS", "SizingError",
    "kv_dtype", "weight_format", "FRAMEWORKS", "GiB", "MiB", "Hardware", "custom_hardware", "get_hardware",
    "hardware_from_dict", "hardware_info", "hardware_presets", "measure_this_machine", "checkpoint_from_folder",
    "Measurement", "PresetInfo", "Source", "preset_info",
    "get_model", "model_from_folder", "model_from_path", "model_preset_config", "model_presets",
    "parse_config_text", "read_safetensors_header", "MAX_BATCH", "MAX_CONTEXT", "CurvePoint", "HardwareRow",
]
