"""The engine: sequences, scheduler, model runner, sampler, LLMEngine and the offline API."""

from atomk31.engine.llm import LLM
from atomk31.engine.llm_engine import LLMEngine, PromptTooLongError
from atomk31.engine.outputs import CompletionOutput, RequestOutput
from atomk31.engine.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "PromptTooLongError", "CompletionOutput", "RequestOutput",
           "SamplingParams"]
