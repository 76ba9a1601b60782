"""vaswani_hf: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers model.

Importing the package registers the model with the Auto classes under model_type "vaswani", so that
`AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM` build and load it. `TranslationPipeline` is the translation
pipeline that every saved model declares for `pipeline("translation", model=folder, trust_remote_code=True)`;
on model objects, build it directly: `TranslationPipeline(model=model, tokenizer=tokenizer)` (transformers 5
refuses the task name "translation" unless it comes from a model folder's config).
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_vaswani import VaswaniConfig
from .modeling_vaswani import VaswaniForConditionalGeneration, VaswaniModel, VaswaniPreTrainedModel
from .pipeline_vaswani import TranslationPipeline
from .speed.allocator import keep_freed_memory
from .speed.fast_cpu import fast_cpu
from .speed.fast_gpu import fast_gpu
from .speed.quantization import quantize_int8


def register() -> None:
    """Register the classes with the Auto classes (for `save_pretrained` also write `auto_map` and the code
    files). Safe to call any number of times."""
    AutoConfig.register(VaswaniConfig.model_type, VaswaniConfig, exist_ok=True)
    AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
    AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)
    VaswaniConfig.register_for_auto_class()
    VaswaniModel.register_for_auto_class("AutoModel")
    VaswaniForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")


register()

__all__ = [
    "TranslationPipeline",
    "VaswaniConfig",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "fast_cpu",
    "fast_gpu",
    "keep_freed_memory",
    "quantize_int8",
    "register",
]
