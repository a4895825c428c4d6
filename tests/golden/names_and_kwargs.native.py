import torch
import operator

def execution_fn(torch_1, len_1, v__fx_c0, __vllm_submods__):
    submod_0 = __fx_s0(torch_1, len_1, **{'lambda': v__fx_c0, 'a b': __vllm_submods__, 'ok': 1})
    del torch_1, len_1, v__fx_c0, __vllm_submods__
    len_1_1 = len(submod_0)
    del submod_0
    return len_1_1
