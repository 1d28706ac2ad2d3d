"""Llama-family models: configs and presets, the eager decoder, KV caches (contiguous and
paged), checkpoint loading.

    from onetrip.models import get_config, Model, load_model
"""

from .config import PRESETS, ModelConfig, RopeScaling, get_config, rope_frequencies, rope_tables
from .llama import KVCache, Model, greedy_generate
from .loader import load_config, load_model, save_model
from .paged import PagedKVCache, PagePlan, plan_pages

__all__ = [
    "ModelConfig", "RopeScaling", "PRESETS", "get_config", "rope_frequencies", "rope_tables",
    "Model", "KVCache", "PagedKVCache", "PagePlan", "plan_pages", "greedy_generate", "load_config", "load_model",
    "save_model",
]
