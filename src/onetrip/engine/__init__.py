"""The decode engine around the model: the prefill/decode loop (one CUDA-graph replay per
token), continuous batching over a paged KV pool (``Scheduler``) and offline generation on
it (``LLM``), sampling that a CUDA graph can capture, and tokenization with chat templates
and streaming detokenization.

    from onetrip.engine import Engine, LLM, Scheduler, SamplingParams, sample, Tokenizer, IncrementalDecoder
"""

from .generate import Engine, GenerationResult
from .llm import LLM, Completion, stop_string_cut
from .sampling import SamplingParams, sample
from .scheduler import RequestOutput, Scheduler
from .tokenizer import IncrementalDecoder, Tokenizer

__all__ = ["Engine", "GenerationResult", "LLM", "Completion", "stop_string_cut", "Scheduler", "RequestOutput",
           "SamplingParams", "sample", "Tokenizer", "IncrementalDecoder"]
