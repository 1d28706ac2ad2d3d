"""Llama-family models: configs and presets, the decoder with its eager and fused backends,
KV caches (contiguous and paged), checkpoint loading.

    from onetrip.models import get_config, Model, load_model
"""

from .config import PRESETS, ModelConfig, RopeScaling, get_config, rope_frequencies, rope_tables
from .fused import FusedOptions
from .layers import KVCache
from .llama import Model, greedy_generate
from .loader import load_config, load_model, save_model
from .paged import PagedKVCache, PagePlan, plan_pages

__all__ = [
    "ModelConfig", "RopeScaling", "PRESETS", "get_config", "rope_frequencies", "rope_tables",
    "Model", "FusedOptions", "KVCache", "PagedKVCache", "PagePlan", "plan_pages", "greedy_generate",
    "load_config", "load_model", "save_model",
]
