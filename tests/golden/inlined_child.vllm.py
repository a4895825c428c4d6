import torch
import operator

def __vllm_inlined_submods__1(inp):
    mul_tensor = torch.ops.aten.mul.Tensor(inp, 3)
    del inp
    to = mul_tensor.to(device=__vllm_consts__[0])
    return (to, mul_tensor)

def execution_fn(x, *, __vllm_submods__):
    submod_0 = __vllm_submods__[0](x, device=__vllm_consts__[0])
    del x
    getitem = submod_0[0]
    del submod_0
    submod_1 = __vllm_inlined_submods__1(getitem)
    del getitem
    getitem_1 = submod_1[0]
    del submod_1
    return getitem_1
