"""The decode engine around the model: the prefill/decode loop (one CUDA-graph replay per
token), sampling that a CUDA graph can capture, and
tokenization with chat templates and streaming detokenization.

    from onetrip.engine import Engine, SamplingParams, sample, Tokenizer, IncrementalDecoder
"""

from .generate import Engine, GenerationResult
from .sampling import SamplingParams, sample
from .tokenizer import IncrementalDecoder, Tokenizer

__all__ = ["Engine", "GenerationResult", "SamplingParams", "sample", "Tokenizer", "IncrementalDecoder"]
