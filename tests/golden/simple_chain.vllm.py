import torch
import operator

def execution_fn(x, y, *, __vllm_submods__):
    submod_0 = __vllm_submods__[0](x, y)
    del y
    getitem = submod_0[0]
    getitem_1 = submod_0[1]
    del submod_0
    submod_1 = __vllm_submods__[1](getitem, scale=2.0)
    del getitem
    return (submod_1, getitem_1, x)
