"""What StreamRL imports from `transformers` itself, for pyright (`make check`): the real
`transformers/__init__.py` star-imports every model package under TYPE_CHECKING, which costs
pyright about 3,000 files and half its time. Each name is re-exported from the module that
defines it, so its types are the library's own; submodules (`transformers.models...`)
resolve to the installed package. A name missing here is an unknown-import error: add it.
"""

from transformers.modeling_utils import PreTrainedModel as PreTrainedModel
from transformers.models.auto.configuration_auto import AutoConfig as AutoConfig
from transformers.models.auto.modeling_auto import AutoModelForCausalLM as AutoModelForCausalLM
from transformers.models.auto.tokenization_auto import AutoTokenizer as AutoTokenizer
from transformers.models.llama.configuration_llama import LlamaConfig as LlamaConfig
from transformers.models.llama.modeling_llama import LlamaForCausalLM as LlamaForCausalLM
from transformers.tokenization_utils_base import PreTrainedTokenizerBase as PreTrainedTokenizerBase
from transformers.tokenization_utils_tokenizers import PreTrainedTokenizerFast as PreTrainedTokenizerFast
