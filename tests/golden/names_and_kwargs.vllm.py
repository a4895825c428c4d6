import torch
import operator

def execution_fn(torch_1, len_1, __fx_c0, v__vllm_submods__, *, __vllm_submods__):
    submod_0 = __vllm_submods__[0](torch_1, len_1, **{'lambda': __fx_c0, 'a b': v__vllm_submods__, 'ok': 1})
    del torch_1, len_1, __fx_c0, v__vllm_submods__
    len_1_1 = len(submod_0)
    del submod_0
    return len_1_1
