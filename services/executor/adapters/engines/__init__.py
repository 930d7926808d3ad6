"""Inference engines behind one small interface, chosen by name from the settings."""

from contracts.events.executor import EngineName
from services.executor.adapters.engines.base import Engine


def create_engine(name: EngineName, n_threads: int) -> Engine:
    if name == "llamacpp":
        from services.executor.adapters.engines.llamacpp import LlamaCppEngine

        return LlamaCppEngine(n_threads=n_threads)
    if name == "tensorrt_llm":
        from services.executor.adapters.engines.tensorrt_llm import TensorRtLlmEngine

        return TensorRtLlmEngine()
    if name == "transformers":
        from services.executor.adapters.engines.transformers_engine import TransformersEngine

        return TransformersEngine(n_threads=n_threads)
    if name == "simulated":
        from services.executor.adapters.engines.simulated import SimulatedEngine

        return SimulatedEngine()
    raise NotImplementedError(f"engine {name!r} is not available in this build")
