import torch
import operator

def __fx_f1(inp):
    mul_tensor = torch.ops.aten.mul.Tensor(inp, 3)
    del inp
    to = mul_tensor.to(device=__fx_c0)
    return (to, mul_tensor)

def execution_fn(x):
    submod_0 = __fx_s0(x, device=__fx_c0)
    del x
    getitem = submod_0[0]
    del submod_0
    submod_1 = __fx_f1(getitem)
    del getitem
    getitem_1 = submod_1[0]
    del submod_1
    return getitem_1
